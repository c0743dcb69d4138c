"""JupyterHub configuration of the course's class (JupyterHub 6.1): `make hub`, or
`jupyterhub -f config/hub/jupyterhub_config.py` as root after `python -m autograder hub setup`.

Everything here is the hub's own machinery, configured: PAM logins for the class's system users, JupyterHub's
LocalProcessSpawner (autograder.hub.spawner.CourseSpawner: the course's environment by role, limits per student),
configurable-http-proxy on the loopback interface. The class (who may log in, who is an instructor, where the exchange
is) comes from the state file `python -m autograder hub setup` wrote (LLM_COURSE_HUB_ROOT, /srv/llm-course-hub).
"""

import os
from pathlib import Path

from autograder.hub.classroom import COURSE_ID, DEFAULT_ROOT, HUB_PID, load_roster
from autograder.paths import REPO_ROOT

c = get_config()  # noqa: F821  (provided by traitlets when JupyterHub loads this file)

root = Path(os.environ.get("LLM_COURSE_HUB_ROOT", DEFAULT_ROOT))
roster = load_roster(root)
state = root / "hub"
state.mkdir(mode=0o700, exist_ok=True)

c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ.get('LLM_COURSE_HUB_PORT', '8000')}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("LLM_COURSE_HUB_INTERNAL_PORT", "8081"))      # the hub behind the proxy
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('LLM_COURSE_HUB_PROXY_API_PORT', '8001')}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.ConfigurableHTTPProxy.command = [str(REPO_ROOT / ".venv" / "hub-proxy" / "node_modules" / ".bin" /
                                       "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")
c.JupyterHub.pid_file = str(state / HUB_PID)              # `hub teardown` stops a running hub through it

c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(roster.users)
c.Authenticator.admin_users = {roster.instructor}

c.JupyterHub.spawner_class = "autograder.hub.spawner.CourseSpawner"
c.Spawner.cmd = [str(Path(roster.venv) / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.mem_limit = os.environ.get("LLM_COURSE_MEM_LIMIT", "4G")
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 120
c.CourseSpawner.exchange = roster.exchange
c.CourseSpawner.course_id = COURSE_ID
c.CourseSpawner.venv = roster.venv
# An idle server is not culled here (that is jupyterhub-idle-culler's job, a hub service; see docs/hub.md).
