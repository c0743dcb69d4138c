"""Channels that carry one request's KV cache, layer by layer, from a prefill worker to a decode worker.

    channel = QueueChannel()                                  # two threads of one process
    channel.send("req-1", layer, k, v)                        # k, v (T, n_kv_heads, head_dim)
    msg = channel.recv(timeout_s=5.0)                         # KVMessage(request_id, layer, k, v, src_blocks)

    channel = GlooChannel(peer=1)                             # rank 0 of two torch.distributed (gloo) processes
    channel.send("req-1", layer, k, v); channel.flush(); channel.close()
    channel = GlooChannel(peer=0)                             # rank 1
    msg = channel.recv(timeout_s=5.0)                         # TransferTimeout after 5 s with nothing
    channel.kv_bytes_received, channel.header_bytes_received

    FailingChannel(channel, fail_at_layer=3)                  # recv raises TransferError when layer 3 arrives

The decode side must treat a message as data from another machine. `src_blocks` are the ids of the blocks the
PRODUCER held the layer in: they mean nothing in the decode worker's pool (a connector that wrote there would
overwrite another request's cache); the decode side allocates its own blocks and keeps its own table.

GlooChannel's wire format, one message a layer, all on one tag, in this order:

    header  int64 (16,): MAGIC, layer, T, n_kv_heads, head_dim, dtype code, n src blocks, id length,
                         perf_counter() at send as float64 bits, the request id in UTF-8 (at most 56 bytes)
    src     int64 (n src blocks,)            (left out when there are none)
    k, v    (T, n_kv_heads, head_dim)        the payload: 2 * T * n_kv_heads * head_dim * element size bytes

A header with layer = -1 closes the stream. The bytes of k and v are counted apart from the header's and src's,
so a test can hold them to the formula 2 * T * n_kv_heads * head_dim * 4 a layer (fp32).

How it moves. `send` queues the message and returns: a sending thread posts each message's tensors
(`dist.isend`) and waits for them before taking the next, one message at a time like a link, so the producer goes
on computing (posting from the computing thread stalled it for milliseconds while gloo was busy with the previous
message). `flush` waits until the queue is empty. gloo hands a message over only once the receiver has posted a
matching receive, so the receiving end runs a thread that posts receives continuously and queues what arrives;
`recv(timeout_s)` reads that queue. A timed-out `recv` therefore leaves no half-posted receive behind (gloo's own
`Work.wait(timeout)` closes the connection instead), and a message that arrives later is there for the next `recv`.

`emulated_bandwidth` (bytes/s) makes the receiving thread hold each message back as a link of that bandwidth
would: delivered at max(sent, previous delivery) + bytes / bandwidth, the sender's clock read from the header
(time.perf_counter is CLOCK_MONOTONIC, one clock for every process of a Linux host). It is an EMULATION of a
slower link on top of loopback, for the notebook; leave it None to measure loopback as it is.
"""

from __future__ import annotations

import queue
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from minigpt.cache.block_table import blocks_needed

__all__ = ["KVMessage", "TransferError", "TransferTimeout", "QueueChannel", "GlooChannel", "FailingChannel",
           "MAX_REQUEST_ID_BYTES", "HEADER_BYTES"]


class TransferError(RuntimeError):
    """A request's KV transfer failed: a lost or corrupt message, a peer that went away, a stream out of step."""


class TransferTimeout(TransferError):
    """No message arrived within the timeout."""


@dataclass(frozen=True)
class KVMessage:
    """One layer of one request's KV cache as the decode side receives it.

    k, v: (T, n_kv_heads, head_dim), token t at row t (RoPE already applied to k).
    src_blocks: the producer's block ids for this request; meaningless in the receiver's pool.
    """

    request_id: str
    layer: int
    k: Tensor
    v: Tensor
    src_blocks: list[int] = field(default_factory=list)


MAGIC = 0x4B56_4C41_5945_5200          # "KVLAYER" + 0: a header that does not start with it is not ours
_FIXED = 9                             # header fields before the request id
MAX_REQUEST_ID_BYTES = 56              # 7 int64 slots
_HEADER_LEN = _FIXED + MAX_REQUEST_ID_BYTES // 8
HEADER_BYTES = _HEADER_LEN * 8
_CLOSE = -1
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_DTYPE_OF = {code: dtype for dtype, code in _DTYPES.items()}


def _check_kv(layer: int, k: Tensor, v: Tensor) -> None:
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be a non-negative int, got {layer!r}")
    if k.ndim != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be (T, n_kv_heads, head_dim), got {tuple(k.shape)} and {tuple(v.shape)}")


class _ProducerBlocks:
    """The block ids a prefill worker would have used: each new request gets the next ceil(T / block_size) ids,
    counting from `base` (a different pool's numbering, on purpose)."""

    def __init__(self, block_size: int, base: int) -> None:
        self.block_size, self.next, self.given = block_size, base, {}

    def __call__(self, request_id: str, n_tokens: int) -> list[int]:
        if request_id not in self.given:
            n = blocks_needed(n_tokens, self.block_size)
            self.given[request_id] = list(range(self.next, self.next + n))
            self.next += n
        return self.given[request_id]


class QueueChannel:
    """Both ends in one process (threads, or one thread sending everything first): a thread-safe queue.

    `send` copies k and v (the consumer gets its own tensors, as after a real transfer) and counts their bytes.
    `src_blocks` default to the producer's own numbering from `src_block_base` (see the module docstring).
    """

    def __init__(self, *, block_size: int = 16, src_block_base: int = 1000) -> None:
        self._queue: queue.Queue[KVMessage] = queue.Queue()
        self._producer_blocks = _ProducerBlocks(block_size, src_block_base)
        self.messages_sent = self.kv_bytes_sent = self.header_bytes_sent = 0
        self.messages_received = self.kv_bytes_received = self.header_bytes_received = 0

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor, src_blocks: Sequence[int] | None = None) -> None:
        _check_kv(layer, k, v)
        src = list(src_blocks) if src_blocks is not None else self._producer_blocks(request_id, k.shape[0])
        self._queue.put(KVMessage(request_id, layer, k.detach().clone(), v.detach().clone(), src))
        self.messages_sent += 1
        self.kv_bytes_sent += k.nbytes + v.nbytes

    def recv(self, timeout_s: float) -> KVMessage:
        try:
            msg = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            raise TransferTimeout(f"no KV message arrived within {timeout_s:g} s (QueueChannel: did the producer "
                                  "send every layer?)") from None
        self.messages_received += 1
        self.kv_bytes_received += msg.k.nbytes + msg.v.nbytes
        return msg

    def pending(self) -> int:
        """Messages sent and not yet received."""
        return self._queue.qsize()


class FailingChannel:
    """Wraps a channel; `recv` raises TransferError when a message of layer `fail_at_layer` (of `request_id`,
    or of any request when None) arrives, as if that layer had been lost on the way. Sends pass through; the
    other attributes (the byte counters) are the inner channel's."""

    def __init__(self, inner: object, fail_at_layer: int, *, request_id: str | None = None) -> None:
        self.inner, self.fail_at_layer, self.request_id = inner, fail_at_layer, request_id

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor, src_blocks: Sequence[int] | None = None) -> None:
        self.inner.send(request_id, layer, k, v, src_blocks)

    def recv(self, timeout_s: float) -> KVMessage:
        msg = self.inner.recv(timeout_s)
        if msg.layer == self.fail_at_layer and self.request_id in (None, msg.request_id):
            raise TransferError(f"the transfer of request {msg.request_id!r} failed at layer {msg.layer} "
                                "(injected by FailingChannel)")
        return msg

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class GlooChannel:
    """One direction of a KV stream between this rank and `peer` over the default torch.distributed group
    (gloo, CPU tensors). The prefill rank sends, the decode rank receives (module docstring for the format).

    Counters: messages_sent, kv_bytes_sent (k and v), header_bytes_sent (header and src ids), and the same
    for received; `arrived_at[(request_id, layer)]` is the perf_counter() at which a layer reached this end.
    `close()` ends the stream (a closing header, if this end sent anything) and stops both threads (the receiving
    one stops at the peer's closing header); use the channel as a context manager.
    """

    def __init__(self, peer: int, *, tag: int = 11, block_size: int = 16, src_block_base: int = 1000,
                 emulated_bandwidth: float | None = None, close_timeout_s: float = 10.0) -> None:
        if not dist.is_initialized():
            raise RuntimeError("GlooChannel needs torch.distributed: start the ranks with "
                               "minigpt.parallel.launch.run_ranks(..., backend='gloo')")
        if peer == dist.get_rank() or not 0 <= peer < dist.get_world_size():
            raise ValueError(f"peer must be another rank in [0, {dist.get_world_size()}), this is rank "
                             f"{dist.get_rank()}; got {peer!r}")
        if emulated_bandwidth is not None and not emulated_bandwidth > 0:
            raise ValueError(f"emulated_bandwidth must be positive bytes/s or None, got {emulated_bandwidth!r}")
        self.peer, self.tag, self.emulated_bandwidth = peer, tag, emulated_bandwidth
        self.close_timeout_s = close_timeout_s
        self._producer_blocks = _ProducerBlocks(block_size, src_block_base)
        self._outbox: queue.Queue[list[Tensor] | None] = queue.Queue()   # messages waiting for the link
        self._sender: threading.Thread | None = None
        self._send_error: BaseException | None = None
        self._inbox: queue.Queue[KVMessage | BaseException | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.arrived_at: dict[tuple[str, int], float] = {}      # (request id, layer) -> perf_counter() on arrival
        self.messages_sent = self.kv_bytes_sent = self.header_bytes_sent = 0
        self.messages_received = self.kv_bytes_received = self.header_bytes_received = 0

    # --- sending -----------------------------------------------------------------------------------

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor, src_blocks: Sequence[int] | None = None) -> None:
        """Hand one layer to the sending thread (returns at once; `flush` waits until every send has left)."""
        _check_kv(layer, k, v)
        if k.dtype not in _DTYPES or k.dtype != v.dtype:
            raise ValueError(f"k and v must share a dtype among {sorted(map(str, _DTYPES))}, got {k.dtype}, {v.dtype}")
        if self._closed:
            raise TransferError("this GlooChannel is closed")
        src = list(src_blocks) if src_blocks is not None else self._producer_blocks(request_id, k.shape[0])
        header = _encode_header(request_id, layer, tuple(k.shape), k.dtype, len(src))
        parts = [header] + ([torch.tensor(src, dtype=torch.int64)] if src else [])
        self._post(parts + [k.detach().contiguous(), v.detach().contiguous()])
        self.messages_sent += 1
        self.kv_bytes_sent += k.nbytes + v.nbytes
        self.header_bytes_sent += sum(p.nbytes for p in parts)

    def flush(self) -> None:
        """Wait until every message handed to `send` has been delivered to the peer's receives."""
        self._outbox.join()
        self._raise_send_error()

    def _post(self, tensors: list[Tensor]) -> None:
        self._raise_send_error()
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, name=f"kv-send-to-{self.peer}", daemon=True)
            self._sender.start()
        self._outbox.put(tensors)

    def _send_loop(self) -> None:
        """One message at a time, like a link: post its tensors, wait until they are delivered, take the next."""
        while True:
            tensors = self._outbox.get()
            try:
                if tensors is None:
                    return
                if self._send_error is None:
                    for work in [dist.isend(t, self.peer, tag=self.tag) for t in tensors]:
                        work.wait()
            except BaseException as err:                     # noqa: BLE001 - raised by the next send or flush
                self._send_error = err
            finally:
                self._outbox.task_done()

    def _raise_send_error(self) -> None:
        if self._send_error is not None:
            raise TransferError(f"sending KV to rank {self.peer} failed: {self._send_error}") from self._send_error

    # --- receiving ---------------------------------------------------------------------------------

    def start_receiving(self) -> None:
        """Start the receiving thread now (the first `recv` does it otherwise), so messages flow while this
        process is busy."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._receive_loop, name=f"kv-recv-from-{self.peer}", daemon=True)
            self._thread.start()

    def recv(self, timeout_s: float) -> KVMessage:
        """The next message, waiting at most `timeout_s` seconds; TransferTimeout, or TransferError when the
        stream broke or was closed."""
        self.start_receiving()
        try:
            item = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise TransferTimeout(f"no KV message from rank {self.peer} within {timeout_s:g} s (the prefill worker "
                                  "is slow, stuck or gone); the request's transfer is abandoned") from None
        if isinstance(item, BaseException):
            self._inbox.put(item)                    # every later recv fails the same way
            raise TransferError(f"the KV stream from rank {self.peer} broke: {item}") from item
        if item is None:
            self._inbox.put(None)
            raise TransferError(f"rank {self.peer} closed the KV stream")
        return item

    def _receive_loop(self) -> None:
        # Receives on one tag match sends in order, so once a header is in, the rest of its message AND the
        # next header are posted together: one wake-up of this thread per message rather than one per tensor.
        link_free = 0.0
        try:
            header = torch.empty(_HEADER_LEN, dtype=torch.int64)
            header_work = dist.irecv(header, self.peer, tag=self.tag)
            while True:
                header_work.wait()
                request_id, layer, shape, dtype, n_src, sent_at = _decode_header(header)
                if layer == _CLOSE:
                    self._inbox.put(None)
                    return
                src = torch.empty(n_src, dtype=torch.int64)
                k, v = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
                works = [dist.irecv(t, self.peer, tag=self.tag) for t in ([src] if n_src else []) + [k, v]]
                next_header = torch.empty(_HEADER_LEN, dtype=torch.int64)
                header_work = dist.irecv(next_header, self.peer, tag=self.tag)
                for work in works:
                    work.wait()
                if self.emulated_bandwidth is not None:         # EMULATED link time (module docstring)
                    link_free = max(sent_at, link_free) + (k.nbytes + v.nbytes) / self.emulated_bandwidth
                    time.sleep(max(0.0, link_free - time.perf_counter()))
                self.messages_received += 1
                self.kv_bytes_received += k.nbytes + v.nbytes
                self.header_bytes_received += header.nbytes + src.nbytes
                self.arrived_at[(request_id, layer)] = time.perf_counter()
                self._inbox.put(KVMessage(request_id, layer, k, v, src.tolist()))
                header = next_header
        except BaseException as err:                         # noqa: BLE001 - handed to recv
            self._inbox.put(err)

    # --- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """End the stream: tell the peer (if this end sent anything) and wait for our sends; stop our receiving
        thread (it stops at the peer's closing header)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._sender is not None:
                self._outbox.put([_encode_header("", _CLOSE, (0, 0, 0), torch.float32, 0)])
                self._outbox.put(None)
                self._sender.join(self.close_timeout_s)
                if self._sender.is_alive():
                    raise TransferError(f"the KV sending thread did not finish within {self.close_timeout_s:g} s: "
                                        f"rank {self.peer} is not receiving")
                self._raise_send_error()
        finally:
            if self._thread is not None:
                self._thread.join(self.close_timeout_s)
                if self._thread.is_alive():
                    raise TransferError(f"the KV receiving thread did not stop within {self.close_timeout_s:g} s: "
                                        f"rank {self.peer} never closed its end (call close() on both ranks)")

    def __enter__(self) -> "GlooChannel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _encode_header(request_id: str, layer: int, shape: tuple[int, int, int], dtype: torch.dtype, n_src: int) -> Tensor:
    raw = request_id.encode()
    if len(raw) > MAX_REQUEST_ID_BYTES:
        raise ValueError(f"request id {request_id!r} is {len(raw)} bytes in UTF-8; at most {MAX_REQUEST_ID_BYTES}")
    sent_at = struct.unpack("<q", struct.pack("<d", time.perf_counter()))[0]
    fixed = [MAGIC, layer, *shape, _DTYPES[dtype], n_src, len(raw), sent_at]
    ids = torch.frombuffer(bytearray(raw.ljust(MAX_REQUEST_ID_BYTES, b"\0")), dtype=torch.int64)
    return torch.cat([torch.tensor(fixed, dtype=torch.int64), ids])


def _decode_header(header: Tensor) -> tuple[str, int, tuple[int, int, int], torch.dtype, int, float]:
    fields = header.tolist()
    if fields[0] != MAGIC:
        raise TransferError(f"received a header that is not a KV header (magic {fields[0]:#x}): the two ranks are "
                            "out of step (another message on the same tag?)")
    _, layer, t, h, d, code, n_src, id_len, sent_bits = fields[:_FIXED]
    request_id = header[_FIXED:].numpy().tobytes()[:id_len].decode()
    sent_at = struct.unpack("<d", struct.pack("<q", sent_bits))[0]
    return request_id, layer, (t, h, d), _DTYPE_OF[code], n_src, sent_at
