"""A terminal in a user's JupyterLab on the hub, driven as the user drives theirs: opened with JupyterLab's own REST
call (`POST api/terminals`), typed into and read over the same websocket the browser's terminal uses, with the
session of a login on the hub's page. The shell is whatever the user's server starts (config/hub/<role>/), under
the user's own account and limits: no root, no `su`.

    term = Terminal(hub, session, "llmc-instructor")
    rc, output = term.run("cd ~/course && make autograde JOBS=2", timeout=900)
"""

from __future__ import annotations

import json
import re
import secrets
import time

import websocket


class Terminal:
    def __init__(self, hub, session, user: str) -> None:
        r = hub.api(session, user, "POST", "api/terminals")
        assert r.status_code == 200, f"{user}'s server refused a terminal: {r.status_code} {r.text[:300]}"
        self.name = r.json()["name"]
        self.user, self.hub, self.session = user, hub, session
        xsrf = next((c.value for c in session.cookies if c.name == "_xsrf" and c.path.startswith(f"/user/{user}")), "")
        url = f"{hub.base.replace('http', 'ws', 1)}/user/{user}/terminals/websocket/{self.name}?_xsrf={xsrf}"
        cookies = "; ".join(f"{c.name}={c.value}" for c in session.cookies)
        self.ws = websocket.create_connection(url, cookie=cookies, origin=hub.base, timeout=5)
        self.transcript = ""

    def run(self, command: str, timeout: float = 300) -> tuple[int, str]:
        """Type `command` and Enter; wait for it to finish; its exit status and what the terminal showed meanwhile."""
        mark = secrets.token_hex(4)
        self.ws.send(json.dumps(["stdin", f"{command}; echo \"__done_{mark}_$?__\"\r"]))
        done = re.compile(rf"__done_{mark}_(\d+)__")
        shown, deadline = "", time.monotonic() + timeout
        while not (found := done.search(shown)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.user}'s terminal: `{command}` did not finish within {timeout:g} s; "
                                     f"it showed:\n{_plain(shown)[-3000:]}")
            try:
                message = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if message[0] == "stdout":
                shown += message[1]
            elif message[0] == "disconnect":
                raise AssertionError(f"{self.user}'s terminal closed during `{command}`:\n{_plain(shown)[-3000:]}")
        output = _plain(shown[:found.start()])
        self.transcript += output
        return int(found.group(1)), output

    def must(self, command: str, timeout: float = 300) -> str:
        """run(), failing the test with the terminal's output unless the command exits 0."""
        rc, output = self.run(command, timeout)
        assert rc == 0, f"{self.user}'s terminal: `{command}` exited {rc}:\n{output[-4000:]}"
        return output

    def close(self) -> None:
        self.ws.close()
        self.hub.api(self.session, self.user, "DELETE", f"api/terminals/{self.name}")


def _plain(text: str) -> str:
    """Terminal output without its escape sequences (colours, cursor moves, bracketed paste) and carriage returns."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", text)
