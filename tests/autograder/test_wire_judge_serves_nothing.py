"""The judge's end of the wire serves nothing but `wire.judge_services()`: learner code that holds a handle to one
of the judge's objects (or writes to the socket itself) cannot read the judge's attributes, run course functions
there, or make it decode anything but plain data and the minigpt package's own values."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any, Callable, Iterator

import pytest
import torch

from autograder.checking import wire
from autograder.judging.judge import judge_endpoint
from autograder.judging.observe import kernel_endpoint
from minigpt.config import ModelConfig
from minigpt.model import GPT

TINY = ModelConfig(vocab_size=16, max_seq_len=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16)


@pytest.fixture
def judged() -> Iterator[Callable[[Callable], wire.Remote]]:
    """judged(fn) -> fn as the judge sees it: a Remote served by a 'kernel' thread (observe's own endpoint)."""
    judge_sock, kernel_sock = socket.socketpair()
    names: dict[str, Any] = {}
    kernel = kernel_endpoint(kernel_sock, names)
    thread = threading.Thread(target=kernel.serve, daemon=True)
    thread.start()
    judge = judge_endpoint(judge_sock)

    def remote(fn: Callable) -> wire.Remote:
        names["fn"] = fn
        return judge.request("getname", name="fn")

    remote.kernel = kernel          # the kernel's endpoint of this conversation (for code that writes to it itself)
    yield remote
    judge.finish()
    thread.join(10)
    judge_sock.close()
    kernel_sock.close()


def _model() -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT(TINY).eval()


def _outcome(action: Callable[[], Any]) -> str:
    try:
        value = action()
    except wire.Refused as err:
        return f"refused: {err}"
    except Exception as err:          # noqa: BLE001
        return f"{type(err).__name__}: {err}"
    return f"value {type(value).__name__}"


def test_a_served_model_answers_only_its_service(judged):
    """Calling the model and reading its config work; its weights, its class, its dict, setting an attribute and
    every double-underscore name are refused."""
    def probe(model: Any) -> dict[str, str]:
        ids = torch.tensor([[1, 2, 3]])
        return {"call": _outcome(lambda: model(ids)), "forward": _outcome(lambda: model.forward(ids)),
                "config": _outcome(lambda: model.config), "dtype": _outcome(lambda: model.dtype),
                "state_dict": _outcome(lambda: model.state_dict()),
                "lm_head": _outcome(lambda: model.lm_head),
                "class": _outcome(lambda: model._endpoint.request("getattr", h=model._handle, name="__class__")),
                "globals": _outcome(lambda: model.forward._endpoint.request("getattr", h=model.forward._handle,
                                                                           name="__globals__")),
                "setattr": _outcome(lambda: setattr(model, "training", True)),
                "type": _outcome(lambda: model._endpoint.request("type", h=model._handle)),
                "vars": _outcome(lambda: model._endpoint.request("vars", h=model._handle))}

    seen = judged(probe)(_model())
    assert seen["call"] == seen["forward"] == "value Tensor"
    assert seen["config"] == "value ModelConfig" and seen["dtype"] == "value dtype"
    for what in ("state_dict", "lm_head", "class", "globals", "setattr", "type", "vars"):
        assert "Refused" in seen[what] or seen[what].startswith("refused"), (what, seen[what])


def test_the_judge_hands_out_no_object_of_its_own(judged):
    """A check that passed the kernel anything but data or a listed service fails in the judge, before sending."""
    with pytest.raises(wire.Refused, match="not its own"):
        judged(lambda x: x)(object())
    with pytest.raises(wire.Refused, match="not its own"):
        judged(lambda f: f)(print)


def test_requests_that_would_run_code_in_the_judge_are_refused(judged):
    """getname, package (a course function by a path that reaches os.system), type and vars: all refused."""
    endpoint = judged.kernel

    def probe() -> list[str]:
        asks = [("package", {"path": "autograder.judging.judge:os.getcwd", "args": {"list": []}, "kwargs": {"dict": []}}),
                ("getname", {"name": "__builtins__"}), ("type", {"h": 1}), ("vars", {"h": 1}),
                ("getattr", {"h": 1, "name": "__globals__"})]
        out = []
        for op, payload in asks:
            wire.send_frame(endpoint.sock, {"op": op, **payload}, {})
            header, _ = wire.recv_frame(endpoint.sock)
            out.append(header.get("raise", {}).get("name", "answered"))
        return out

    assert judged(probe)() == ["Refused"] * 5


@pytest.mark.parametrize("value", [{"module": "os"}, {"obj": "autograder.judging.judge:os.system"},
                                   {"obj": "minigpt.checkpoint:os.system"}, {"dc": "autograder.judging.sandbox:SandboxPolicy",
                                                                             "fields": {}},
                                   {"obj": "autograder.grading.batch:autograde"}, {"obj": "minigpt.serving.__main__:main"}])
def test_the_judge_decodes_no_module_and_no_grader_object(value):
    end = wire.Endpoint(socket.socketpair()[0], services=wire.judge_services())
    with pytest.raises((wire.Refused, ValueError, AttributeError)):
        end._decode(value, {})


def test_a_kernel_exception_cannot_pose_as_the_graders_own():
    end = wire.Endpoint(socket.socketpair()[0], services=wire.judge_services())
    err = end._exception({"type": "autograder.checking.thresholds:Uncalibrated", "message": "skip me", "name": "Uncalibrated"})
    assert type(err) is wire.RemoteError


def _frame(text: bytes) -> bytes:
    return struct.pack("!II", len(text), 0) + text


@pytest.mark.parametrize("text", [b'{"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                  b'{"value": ' + b"[" * (wire.MAX_DEPTH + 2) + b"]" * (wire.MAX_DEPTH + 2) + b"}",
                                  b'{"value": [' + b", ".join([b"0"] * (wire.MAX_ITEMS + 10)) + b"]}"])
def test_frames_nested_too_deep_or_too_many_values_are_refused(text):
    a, b = socket.socketpair()
    writer = threading.Thread(target=a.sendall, args=(_frame(text),), daemon=True)
    writer.start()
    with pytest.raises(wire.ChannelClosed, match="refused"):
        wire.recv_frame(b)
    writer.join(10)
    a.close()
    b.close()


def test_a_frame_with_too_much_json_is_refused_before_it_is_read():
    a, b = socket.socketpair()
    a.sendall(struct.pack("!II", wire.MAX_HEADER_BYTES + 1, 0))
    with pytest.raises(wire.ChannelClosed, match="refused"):
        wire.recv_frame(b)
    a.close()
    b.close()
