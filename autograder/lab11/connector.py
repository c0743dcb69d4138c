"""Exercises 2 and 3: both ends of a KV connector, judged on what the judge's own objects saw happen.

    check_prefill_and_send(prefill_and_send)   the producer runs the judge's logged LayerRunner and sends through the
                                               judge's RecordingChannel: one message per layer, in layer order,
                                               each sent before the next layer is computed (layer-wise, as vLLM's
                                               save_kv_layer), K and V exactly the layer's, the right request id,
                                               the greedy first token; a send the channel refused left no trace
    check_receive_kv(receive_kv)               the consumer receives from the judge's ScriptedChannel into the
                                               judge's DecodeKVStore: blocks from the decode side's own pool (never
                                               the producer's ids), every layer received before it returns, layers
                                               arriving out of order written where they belong, greedy decoding from
                                               the table equal to colocated decoding; a transfer that breaks or times
                                               out, or brings a message that does not belong (another request's,
                                               a layer twice, a layer the model lacks), makes it raise and frees
                                               every block it took; the other requests' blocks stay held and
                                               untouched (the judge wrote them, it reads them back)

The learner's functions only ever hold the judge's objects through the methods the exercise names, and those objects
only report: each notes what happened once it has happened (a layer that ran, a message whole in the judge's hands,
a message handed out), so a call that fails, or that hands over something other than plain data, leaves no record.
The order of calls, every layer's message, the deliveries and the pool's blocks (which are held, and what the other
requests' blocks contain) are read here, where the learner's code never ran.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import call_learner
from autograder.lab11.common import layer_kv, model, prompt, store
from minigpt.disagg import layerwise, receiver
from minigpt.disagg.channel import KVMessage, TransferError
from minigpt.disagg.layerwise import LayerRunner
from minigpt.disagg.timeline import LoggedRunner, RecordingChannel, ScriptedChannel, Timeline
from minigpt.engine.cached_generation import generate_kv_cache

SEND_WHAT = "Exercise 2 (prefill_and_send)"
RECV_WHAT = "Exercise 3 (receive_kv)"
SEND_REFERENCES = (layerwise.prefill_and_send, layerwise.prefill_then_send)
RECV_REFERENCES = (receiver.receive_kv, receiver.decode_from_blocks)


# ---------------------------------------------------------------------------------------------------
# Exercise 2: the producer
# ---------------------------------------------------------------------------------------------------

def _order_mistake(labels: list[str], n_layers: int) -> str | None:
    """What is wrong with the order of the producer's calls, or None."""
    sends = [lab for lab in labels if lab.startswith("send")]
    layers = [lab for lab in labels if lab.startswith("layer")]
    if len(layers) != n_layers or layers != [f"layer {i}" for i in range(n_layers)]:
        return (f"run every layer once, in order (runner.layer(0, x), then 1, ...); the judge saw "
                f"{layers or 'no layer call'}")
    if len(sends) != n_layers:
        return f"send one message per layer ({n_layers}); the judge received {len(sends)}"
    if sends != [f"send {i}" for i in range(n_layers)]:
        return (f"the layers were sent out of order ({', '.join(s.removeprefix('send ') for s in sends)}): send "
                "layer i's K/V right after computing layer i, so they leave in layer order")
    for i in range(n_layers - 1):
        if labels.index(f"send {i}") > labels.index(f"layer {i + 1}"):
            late = ("every send came after the whole prefill: that is the whole-request variant; " if
                    labels.index("send 0") > labels.index(f"layer {n_layers - 1}") else "")
            return (f"{late}layer {i}'s K/V was sent after layer {i + 1} was computed. Layer-wise means sending "
                    f"layer {i} as soon as it is computed, so its transfer overlaps the next layers' compute")
    return None


def _missing_message(messages: list[KVMessage], n_layers: int) -> str | None:
    """What is wrong with the messages the judge holds (one per layer, in layer order), or None."""
    layers = [msg.layer for msg in messages]
    if layers == list(range(n_layers)):
        return None
    lost = [i for i in range(n_layers) if i not in layers]
    return (f"no message arrived for layer {lost[0]} (the judge holds messages for layers {layers}): every layer's "
            "K/V must reach the channel, channel.send(request_id, i, k, v) with the tensors runner.layer returned"
            if lost else f"the judge received messages for layers {layers}: send each layer once, in layer order")


def _check_one_prefill(fn: Callable, name: str, length: int, seed: int) -> None:
    m = model(name, seed)
    tokens = prompt(name, length, seed + 1)
    truth, first = layer_kv(m, tokens)
    log = Timeline()
    runner, channel = LoggedRunner(LayerRunner(m), log), RecordingChannel(log)
    request_id = f"req-{seed}"
    where = f"{SEND_WHAT}, {name}, a {length}-token prompt"
    with no_calls_into(*SEND_REFERENCES, what=SEND_WHAT):
        got: Any = call_learner(SEND_WHAT, fn, runner, list(tokens), channel, request_id, context=where)
    mistake = _order_mistake(log.kinds(), m.config.n_layers) or _missing_message(channel.messages,
                                                                                  m.config.n_layers)
    if mistake:
        raise AssertionError(f"{where}: {mistake}")
    for msg in channel.messages:
        i = msg.layer
        if msg.request_id != request_id:
            raise AssertionError(f"{where}: layer {i} was sent for request {msg.request_id!r}; the consumer files "
                                 f"messages by request id: send the one you were given ({request_id!r})")
        k, v = truth[i]
        if not (isinstance(msg.k, torch.Tensor) and isinstance(msg.v, torch.Tensor)):
            raise AssertionError(f"{where}: send tensors k and v")
        if msg.k.shape == v.shape and torch.equal(msg.k, v) and torch.equal(msg.v, k) and not torch.equal(k, v):
            raise AssertionError(f"{where}: layer {i}'s K and V are swapped: send(request_id, layer, k, v)")
        if msg.k.shape != k.shape or msg.v.shape != v.shape:
            raise AssertionError(f"{where}: layer {i}'s K/V have shapes {tuple(msg.k.shape)}/{tuple(msg.v.shape)}; "
                                 f"send them as runner.layer returned them, {tuple(k.shape)} each")
        if not (torch.equal(msg.k, k) and torch.equal(msg.v, v)):
            raise AssertionError(f"{where}: layer {i}'s K/V are not the ones runner.layer({i}, x) returned for this "
                                 "prompt (did each layer get the previous layer's output?)")
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.is_floating_point():
        got = int(got)
    if not isinstance(got, int) or isinstance(got, bool):
        raise AssertionError(f"{where}: return the first token as an int, got {type(got).__name__}")
    if got != first:
        raise AssertionError(f"{where}: returned token {got}; the greedy first token is the argmax of "
                             "runner.logits(x) after the last layer")


def check_prefill_and_send(fn: Callable) -> None:
    """fn(runner, prompt, channel, request_id) -> first token; channel.send(request_id, i, k, v) after each layer."""
    own_work(fn, SEND_REFERENCES, what=SEND_WHAT)
    for name, length, seed in (("GQA 4q/2kv, 3 layers", 9, 0), ("MQA 4q/1kv, 4 layers", 5, 3),
                               ("MHA 2q/2kv, 2 layers", 1, 5)):
        _check_one_prefill(fn, name, length, seed)


# ---------------------------------------------------------------------------------------------------
# Exercise 3: the consumer
# ---------------------------------------------------------------------------------------------------

BLOCK_SIZE = 4
NUM_BLOCKS = 12
PRODUCER_BLOCKS = [0, 1, 2, 3]      # what the prefill side's table said: on the decode side blocks 0-3 are taken


def _messages(truth: list[tuple[torch.Tensor, torch.Tensor]], request_id: str, order: list[int]) -> list[KVMessage]:
    n_blocks = math.ceil(truth[0][0].shape[0] / BLOCK_SIZE)
    return [KVMessage(request_id=request_id, layer=i, k=truth[i][0], v=truth[i][1],
                      src_blocks=PRODUCER_BLOCKS[:n_blocks]) for i in order]


class _DecodeSide:
    """The decode worker's store with some blocks already holding other requests' K/V (so its free blocks are not
    the producer's ids), and what the judge knows of them: which blocks they hold and what is in them."""

    def __init__(self, m, seed: int = 12) -> None:
        self.store = store(m, NUM_BLOCKS, BLOCK_SIZE)
        self.others = self.store.allocate(len(PRODUCER_BLOCKS))
        g = torch.Generator().manual_seed(seed)
        n_tokens, cfg = len(self.others) * BLOCK_SIZE, m.config
        self.content = [(torch.randn(n_tokens, cfg.n_kv_heads, cfg.head_dim, generator=g),
                         torch.randn(n_tokens, cfg.n_kv_heads, cfg.head_dim, generator=g)) for _ in range(cfg.n_layers)]
        for layer, (k, v) in enumerate(self.content):
            self.store.write(layer, self.others, k, v)

    def held(self) -> set[int]:
        """The blocks allocated now, read from the pool itself."""
        return {b for b in range(self.store.num_blocks) if not self.store.pool.is_free(b)}

    def others_mistake(self) -> str | None:
        """What happened to the other requests' blocks (freed, or written over), or None."""
        freed = sorted(set(self.others) - self.held())
        if freed:
            return (f"block(s) {freed} that other requests hold were freed: free only the blocks this request "
                    "allocated (the ones store.allocate returned), never a message's src_blocks or guessed ids")
        n_tokens = len(self.others) * BLOCK_SIZE
        for layer, (k, v) in enumerate(self.content):
            now_k, now_v = self.store.read(layer, self.others, n_tokens)
            if not (torch.equal(now_k, k) and torch.equal(now_v, v)):
                return (f"the K/V of other requests (blocks {self.others}) were written over at layer {layer}: "
                        "write only into the blocks this request allocated, never at a message's src_blocks (the "
                        "producer's ids, which name other requests' blocks here)")
        return None


def _call_consumer(fn: Callable, channel: ScriptedChannel, request_id: str, n_layers: int, n_tokens: int, s: Any,
                   where: str, *, expect_error: bool = False) -> Any:
    try:
        with no_calls_into(*RECV_REFERENCES, what=RECV_WHAT):
            return call_learner(RECV_WHAT, fn, channel, request_id, n_layers, n_tokens, s, context=where,
                                passthrough=(TransferError,) if expect_error else ())
    finally:
        if channel.untimed:            # the judge's channel counted it: no report of the learner's is read
            raise AssertionError(f"{where}: {channel.untimed} recv call(s) with timeout_s=None. On a real link a "
                                 "message that is lost never arrives, and that recv waits for ever, holding the "
                                 "request's blocks: give every recv a timeout")


def _check_one_receive(fn: Callable, name: str, length: int, seed: int, order: str) -> None:
    m = model(name, seed)
    tokens = prompt(name, length, seed + 1)
    truth, first = layer_kv(m, tokens)
    n_layers = m.config.n_layers
    layers = list(range(n_layers)) if order == "in order" else [n_layers - 1] + list(range(n_layers - 1))
    request_id = f"req-{seed}"
    channel = ScriptedChannel(_messages(truth, request_id, layers))
    side = _DecodeSide(m)
    s, taken = side.store, side.others
    free_before = s.num_free
    where = f"{RECV_WHAT}, {name}, a {length}-token prompt, layers arriving {order}"
    got: Any = _call_consumer(fn, channel, request_id, n_layers, length, s, where)
    n_blocks = math.ceil(length / BLOCK_SIZE)
    if channel.delivered < n_layers:
        raise AssertionError(f"{where}: returned after receiving {channel.delivered} of {n_layers} layers. Decoding "
                             "needs every layer's K/V: wait until the last layer has arrived")
    if not isinstance(got, (list, tuple)) or not all(isinstance(b, int) and not isinstance(b, bool) for b in got):
        raise AssertionError(f"{where}: return the block table, a list of block ids (ints), got {type(got).__name__}")
    got = list(got)
    if got == PRODUCER_BLOCKS[:n_blocks]:
        raise AssertionError(f"{where}: the table is the PRODUCER's block ids (message.src_blocks). Those name blocks "
                             "of the prefill worker's pool; on this side they may hold other requests. Allocate "
                             "blocks from the decode side's store (store.allocate) and write into those")
    if len(got) != n_blocks:
        raise AssertionError(f"{where}: {length} tokens in blocks of {BLOCK_SIZE} need {n_blocks} blocks; the table "
                             f"has {len(got)}")
    others = side.others_mistake()
    if others:
        raise AssertionError(f"{where}: {others}")
    if set(got) & set(taken) or free_before - s.num_free != n_blocks or side.held() != set(taken) | set(got):
        raise AssertionError(f"{where}: the table {got} is not {n_blocks} blocks newly allocated from the store "
                             f"({free_before - s.num_free} were taken from it): allocate them once with "
                             "store.allocate(ceil(n_tokens / store.block_size)) and use those")
    for i in range(n_layers):
        k, v = s.read(i, got, length)
        if not (torch.equal(k, truth[i][0]) and torch.equal(v, truth[i][1])):
            hint = (" Layers may arrive in any order: write each message at message.layer, not at its arrival "
                    "index" if order != "in order" else "")
            raise AssertionError(f"{where}: layer {i}'s K/V in the blocks differ from what was sent.{hint}")
    want = generate_kv_cache(m, tokens, 6, stop_token_ids=()).tokens
    with torch.no_grad():
        decoded = receiver.decode_from_blocks(m, s, got, length, first, 6 - 1)
    if [first] + list(decoded) != list(want):
        raise AssertionError(f"{where}: decoding from your blocks gives {[first] + list(decoded)}, colocated decoding "
                             f"{list(want)}")


def _expect_failure(fn: Callable, channel: ScriptedChannel, m, n_tokens: int, what_happens: str,
                    request_id: str = "req-x") -> None:
    """The consumer must raise TransferError and leave the store as it was: its own blocks freed, the other
    requests' blocks held and untouched."""
    side = _DecodeSide(m)
    s = side.store
    free_before = s.num_free
    where = f"{RECV_WHAT}, {what_happens}"
    try:
        _call_consumer(fn, channel, request_id, m.config.n_layers, n_tokens, s, where, expect_error=True)
    except TransferError:
        pass
    else:
        raise AssertionError(f"{where}: your function returned a table although the transfer failed; raise "
                             "TransferError (after freeing the blocks) so this request alone fails")
    others = side.others_mistake()
    if others:
        raise AssertionError(f"{where}: {others}")
    if s.num_free != free_before or side.held() != set(side.others):
        raise AssertionError(f"{where}: {len(side.held() - set(side.others))} block(s) stay allocated after the "
                             "failure. Free every block this request took (store.free(blocks)) before re-raising, or "
                             "the decode worker leaks KV memory with each failed transfer")


def _check_failure(fn: Callable, name: str, fail_at: int, timeout: bool) -> None:
    m = model(name, 7)
    tokens = prompt(name, 10, 8)
    truth, _ = layer_kv(m, tokens)
    channel = ScriptedChannel(_messages(truth, "req-x", list(range(m.config.n_layers))), fail_at=fail_at,
                              timeout=timeout)
    kind = "times out" if timeout else "breaks"
    _expect_failure(fn, channel, m, len(tokens), f"{name}, a transfer that {kind} at message {fail_at}")


def _check_bad_message(fn: Callable, name: str, kind: str) -> None:
    """A message that does not belong: another request's (left over from a failed one), a layer that already
    arrived, a layer the model does not have. Each makes the transfer a failure."""
    m = model(name, 9)
    tokens = prompt(name, 6, 10)
    truth, _ = layer_kv(m, tokens)
    good = _messages(truth, "req-x", list(range(m.config.n_layers)))
    k, v = truth[0]
    stale = [KVMessage("req-old", msg.layer, msg.k, msg.v, []) for msg in good]
    bad = {"another request's messages first": stale + good,
           "layer 0 twice": good[:1] + good,
           "a layer the model does not have": [KVMessage("req-x", m.config.n_layers, k, v, [])] + good}[kind]
    _expect_failure(fn, ScriptedChannel(bad), m, len(tokens),
                    f"{name}, {kind} (a message that does not belong is a broken transfer)")


def check_receive_kv(fn: Callable) -> None:
    """fn(channel, request_id, n_layers, n_tokens, store) -> block table, built from the decode side's own pool."""
    own_work(fn, RECV_REFERENCES, what=RECV_WHAT)
    _check_one_receive(fn, "GQA 4q/2kv, 3 layers", 10, 0, "in order")
    _check_one_receive(fn, "MQA 4q/1kv, 4 layers", 7, 2, "out of order (the last layer first)")
    _check_one_receive(fn, "MHA 2q/2kv, 2 layers", 4, 4, "in order")
    _check_failure(fn, "GQA 4q/2kv, 3 layers", 2, timeout=False)
    _check_failure(fn, "MQA 4q/1kv, 4 layers", 0, timeout=True)
    _check_failure(fn, "MHA 2q/2kv, 2 layers", 1, timeout=True)
    for kind in ("another request's messages first", "layer 0 twice", "a layer the model does not have"):
        _check_bad_message(fn, "GQA 4q/2kv, 3 layers", kind)
