"""Frames of the wire between the judge and the learner's kernel (autograder/checking/wire.py): one JSON header and, when
it carries tensors, one safetensors blob (never pickle), behind two lengths.

    [JSON length, blob length (network order, 4 bytes each)] [JSON] [safetensors blob]

A frame is refused before it is decoded (ChannelClosed) when it is larger than MAX_FRAME_BYTES in all or
MAX_HEADER_BYTES of JSON, nests deeper than MAX_DEPTH levels or holds more than MAX_ITEMS values: a kernel cannot
make the judge hold more than a few hundred MiB for one frame.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:                       # torch and safetensors load only when a frame carries tensors: the grading
    import torch                        # process's control frames (judge.JudgeProcess) never need them

__all__ = ["ChannelClosed", "send_frame", "recv_frame", "MAX_FRAME_BYTES", "MAX_HEADER_BYTES", "MAX_DEPTH",
           "MAX_ITEMS"]

_HEADER = struct.Struct("!II")          # JSON length, tensor blob length
MAX_FRAME_BYTES = 1 << 30               # a frame larger than this is refused (a kernel cannot exhaust the judge)
MAX_HEADER_BYTES = 8 << 20              # a frame's JSON part (values other than tensors)
MAX_DEPTH = 64                          # levels of nesting in one value
MAX_ITEMS = 2_000_000                   # values decoded from one frame


class ChannelClosed(ConnectionError):
    """The other side went away in the middle of a conversation."""


def send_frame(sock: socket.socket, header: dict, tensors: dict[str, torch.Tensor]) -> None:
    blob = safetensors_bytes(tensors) if tensors else b""
    text = json.dumps(header).encode()
    sock.sendall(_HEADER.pack(len(text), len(blob)) + text + blob)


def safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """The same bytes as `safetensors.torch.save(tensors)`, through safetensors' own `serialize` of each tensor's
    memory. `save` first looks at every tensor through numpy and ctypes and checks for shared storage: most of a
    small frame's cost (a judged check sends thousands of frames of a few small tensors each). The wire's tensors
    are CPU clones of their own; anything else (a safetensors without `TensorSpec`, an empty or strided tensor, a
    big-endian machine) goes through `save`. tests/autograder/test_framing.py compares the two on every dtype."""
    import safetensors
    import torch

    spec = getattr(safetensors, "TensorSpec", None)
    if spec is None or sys.byteorder != "little" or not all(
            type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous()
            and t.numel() > 0 for t in tensors.values()):
        from safetensors.torch import save

        return save(tensors)
    specs = {name: spec(dtype=str(t.dtype).split(".")[-1], shape=tuple(t.shape), data_ptr=t.data_ptr(),
                        data_len=t.numel() * t.element_size()) for name, t in tensors.items()}
    return bytes(safetensors.serialize(specs))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ChannelClosed("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> tuple[dict, dict[str, torch.Tensor]]:
    n_text, n_blob = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if n_text + n_blob > MAX_FRAME_BYTES or n_text > MAX_HEADER_BYTES:
        raise ChannelClosed(f"refused a frame of {n_text:,} + {n_blob:,} bytes (at most {MAX_HEADER_BYTES:,} of JSON and "
                            f"{MAX_FRAME_BYTES:,} in all)")
    try:
        header = json.loads(_recv_exact(sock, n_text))
    except RecursionError:
        raise ChannelClosed("refused a frame nested too deeply") from None
    _check_bounds(header)
    if not n_blob:
        return header, {}
    from safetensors.torch import load

    return header, load(_recv_exact(sock, n_blob))


def _check_bounds(header: Any) -> None:
    """Refuse a frame whose values nest deeper than MAX_DEPTH or number more than MAX_ITEMS (walked without
    recursion, before anything is decoded)."""
    stack, items = [(header, 0)], 0
    while stack:
        value, depth = stack.pop()
        items += 1
        if depth > MAX_DEPTH or items > MAX_ITEMS:
            raise ChannelClosed(f"refused a frame of more than {MAX_ITEMS:,} values or {MAX_DEPTH} levels of nesting")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
