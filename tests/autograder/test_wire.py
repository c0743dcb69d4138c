"""The wire between kernel and judge: what travels as data, what as a handle, and what decoding refuses."""

from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any

import pytest
import torch

from autograder.checking import framing, wire
from minigpt.config import ModelConfig


class Pair:
    """Two endpoints on a socketpair: `kernel` serves (in a thread) the names it holds, `judge` asks."""

    def __init__(self, names: dict[str, Any]) -> None:
        a, b = socket.socketpair()
        self.kernel = wire.Endpoint(a, names=names)
        self.judge = wire.Endpoint(b)
        self.done: dict = {}
        self.thread = threading.Thread(target=lambda: self.done.update(self.kernel.serve()), daemon=True)
        self.thread.start()

    def get(self, name: str) -> Any:
        return self.judge.request("getname", name=name)

    def close(self, **pushes: Any) -> dict:
        self.judge.finish(**pushes)
        self.thread.join(timeout=10)
        return self.done


@pytest.fixture
def pair():
    made: list[Pair] = []
    yield lambda names: made.append(Pair(names)) or made[-1]
    for p in made:
        if p.thread.is_alive():
            p.close()


def test_plain_values_travel_as_themselves(pair):
    value = {"n": 3, "x": 0.5, "inf": float("inf"), "s": "tok", "t": (1, [2, 3]), "none": None, "b": b"\x00\x01",
             "set": {1, 2}, 7: "int key", "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "sl": slice(1, None, 2)}
    got = pair({"v": value}).get("v")
    assert got == value and isinstance(got["t"], tuple) and got["dtype"] is torch.bfloat16


def test_tensors_keep_dtype_shape_and_grad(pair):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 3, generator=g).to(torch.bfloat16).requires_grad_(True)
    got = pair({"t": t}).get("t")
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3) and got.requires_grad and torch.equal(got, t.detach())


def test_course_dataclasses_travel_by_value(pair):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32)
    got = pair({"cfg": cfg}).get("cfg")
    assert type(got) is ModelConfig and dataclasses.asdict(got) == dataclasses.asdict(cfg)


def test_a_value_held_where_it_was_built_travels_as_a_handle(pair):
    """remote.held_where: a course dataclass built on the kernel's side stays there; the judge gets a handle, and a
    kernel call given that handle receives the kernel's own object, not a copy (lab 10's trie, sent once)."""
    from autograder.checking.remote import held_where

    seen = []
    p = pair({"fn": lambda cfg: seen.append(cfg) or cfg.n_layers})
    fn = p.get("fn")
    held = held_where(fn, ModelConfig)
    assert isinstance(held, wire.Remote)
    assert fn(held) == ModelConfig().n_layers and fn(held) == ModelConfig().n_layers
    assert len(seen) == 2 and seen[0] is seen[1] and isinstance(seen[0], ModelConfig)
    assert held_where(lambda: None, ModelConfig) == ModelConfig()          # no Remote: built here


def test_learner_functions_are_handles_whose_calls_run_on_their_side(pair):
    ran_in: list[str] = []

    def learner(x, scale=1):
        ran_in.append(threading.current_thread().name)
        return x * scale

    p = pair({"f": learner})
    f = p.get("f")
    assert wire.is_remote(f) and not wire.is_class(f)
    assert f(torch.ones(2), scale=3).tolist() == [3.0, 3.0]
    assert ran_in == [p.thread.name]


def test_classes_instances_attributes_and_iteration(pair):
    class Pool:
        def __init__(self, n):
            self.free = list(range(n))

        def take(self):
            return self.free.pop()

        def __len__(self):
            return len(self.free)

    p = pair({"Pool": Pool})
    cls = p.get("Pool")
    assert wire.is_class(cls)
    pool = cls(3)
    assert pool.take() == 2 and len(pool) == 2 and pool.free == [0, 1]
    pool.free = [9]
    assert pool.take() == 9 and wire.class_of(pool) is cls


def test_a_tensor_the_callee_writes_into_is_written_back(pair):
    def fill(out):
        out.fill_(7)

    out = torch.zeros(3)
    pair({"fill": fill}).get("fill")(out)
    assert out.tolist() == [7.0, 7.0, 7.0]


def test_a_generator_travels_by_value_and_comes_back_advanced(pair):
    def draw(g):
        return torch.rand(3, generator=g)

    g, same = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    first = pair({"draw": draw}).get("draw")(g)
    assert torch.equal(first, torch.rand(3, generator=same))
    assert torch.equal(torch.rand(2, generator=g), torch.rand(2, generator=same))   # g advanced like `same`


def test_the_global_rng_goes_with_the_call(pair):
    f = pair({"draw": lambda: torch.rand(2)}).get("draw")
    with torch.random.fork_rng():           # what this test does to the global RNG stays in it
        torch.manual_seed(11)
        remote = torch.cat([f(), torch.rand(2)])
        torch.manual_seed(11)
        assert torch.equal(remote, torch.rand(4))


def test_storage_address_tells_views_from_copies(pair):
    buf = torch.zeros(4, 4)
    p = pair({"view": lambda: buf[:2], "copy": lambda: buf[:2].clone(), "buf": lambda: buf})
    b, v, c = p.get("buf")(), p.get("view")(), p.get("copy")()
    assert wire.storage_address(v) == wire.storage_address(b) != wire.storage_address(c)


def test_exceptions_come_back_as_their_type(pair):
    from minigpt.cache.block_pool import OutOfBlocks

    class Mine(Exception):
        pass

    def raise_(kind):
        raise {"value": ValueError("bad size"), "course": OutOfBlocks(3, 1), "mine": Mine("odd")}[kind]

    f = pair({"f": raise_}).get("f")
    with pytest.raises(ValueError, match="bad size"):
        f("value")
    with pytest.raises(OutOfBlocks, match="need 3 free"):
        f("course")
    with pytest.raises(wire.RemoteError, match="Mine: odd"):
        f("mine")


def test_calls_nest_both_ways(pair):
    def learner_generate(model, n):
        return [model(i) for i in range(n)]

    calls: list[int] = []

    def judge_model(i):
        calls.append(i)
        return i * 10

    assert pair({"gen": learner_generate}).get("gen")(judge_model, 3) == [0, 10, 20]
    assert calls == [0, 1, 2]


def test_unknown_names_raise_name_error(pair):
    with pytest.raises(NameError):
        pair({}).get("missing")


def test_pushes_reach_the_serving_side(pair):
    p = pair({})
    assert p.close(pushes={"result": 3})["pushes"] == {"result": 3}


def test_decoding_refuses_objects_outside_the_course_package():
    for path in ("os:system", "subprocess:Popen", "builtins:eval"):
        with pytest.raises(ValueError):
            wire.trusted_object(path)


def test_a_function_claiming_to_be_the_reference_is_still_a_handle():
    from minigpt.cache import block_pool

    def fake():
        return 1
    fake.__module__, fake.__qualname__ = block_pool.__name__, "BlockPool"
    assert not wire._is_course_object(fake)
    assert wire._is_course_object(block_pool.BlockPool)


def test_oversized_frames_are_refused(monkeypatch):
    a, b = socket.socketpair()
    monkeypatch.setattr(framing, "MAX_FRAME_BYTES", 1000)
    a.sendall(framing._HEADER.pack(10, 5000))
    with pytest.raises(wire.ChannelClosed, match="refused a frame"):
        wire.recv_frame(b)


def test_modules_beside_a_submission_are_not_imported(tmp_path, monkeypatch):
    (tmp_path / "planted_module_x.py").write_text("raise SystemExit('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="does not import"):
        wire.installed_module("planted_module_x")
    with pytest.raises(ValueError, match="does not import"):
        wire.installed_module("idlelib.idle")          # importing it would open IDLE
    assert wire.installed_module("math").sqrt(4.0) == 2.0
    assert wire.installed_module("minigpt.config").ModelConfig is ModelConfig
