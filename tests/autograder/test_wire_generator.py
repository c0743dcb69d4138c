"""autograder.checking.wire: a torch.Generator handed to a call on the other side travels by value (its state) and takes the
state the callee left it in, so seeded draws go on exactly as in one process. Costs well under a second."""

from __future__ import annotations

import socket
import threading

import torch

from autograder.checking import wire


def draw_two(generator: torch.Generator) -> list[float]:
    return torch.rand(2, generator=generator).tolist()


def _served(names: dict) -> tuple[wire.Endpoint, threading.Thread]:
    """A caller's Endpoint talking to a thread that serves `names` (the kernel's side), until finish()."""
    ours, theirs = socket.socketpair()
    kernel = wire.Endpoint(theirs, names=names)
    thread = threading.Thread(target=kernel.serve, daemon=True)
    thread.start()
    return wire.Endpoint(ours), thread


def test_a_generator_drawn_from_on_the_other_side_advances_here() -> None:
    caller, thread = _served({"draw_two": draw_two})
    try:
        remote_draw = caller.request("getname", name="draw_two")
        judged = torch.Generator().manual_seed(3)
        got = [remote_draw(judged), torch.rand(1, generator=judged).tolist()]
        local = torch.Generator().manual_seed(3)
        want = [draw_two(local), torch.rand(1, generator=local).tolist()]
        assert got == want
        assert torch.equal(judged.get_state(), local.get_state())
    finally:
        caller.finish()
        thread.join(timeout=5)


def test_a_generator_left_alone_is_not_changed() -> None:
    caller, thread = _served({"length": len})
    try:
        judged = torch.Generator().manual_seed(4)
        state = judged.get_state()
        assert caller.request("getname", name="length")([judged, 1]) == 2
        assert torch.equal(judged.get_state(), state)
    finally:
        caller.finish()
        thread.join(timeout=5)
