"""A tensor on the meta device crosses the wire as its shape and dtype (lab 01 asks a cache built with device='meta'
for its buffers)."""

from __future__ import annotations

import socket

import torch

from autograder.checking import wire


def test_meta_tensor_arrives_with_its_shape_dtype_and_device() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sender, receiver = wire.Endpoint(ours), wire.Endpoint(theirs)
        tensors: dict[str, torch.Tensor] = {}
        sent = torch.empty(2, 5, 3, dtype=torch.bfloat16, device="meta")
        got = receiver._decode(sender._encode(sent, tensors, []), tensors)
    assert not tensors, "a meta tensor has no data to send"
    assert got.is_meta and tuple(got.shape) == (2, 5, 3) and got.dtype == torch.bfloat16
