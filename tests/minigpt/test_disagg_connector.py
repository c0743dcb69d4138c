"""Lab 11's KV connector: the layer-by-layer prefill, both producers, the decode side's receiving loop and store,
decoding from the received blocks, and the gloo channel between two real processes (bytes against the formula)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch
import torch.distributed as dist

from minigpt_fixtures import seeded
from recorded_logprobs import assert_same_steps, record_results, record_sampling, with_logprobs

from minigpt.cache.block_table import blocks_needed
from minigpt.cache.contiguous import KVCache
from minigpt.checkpoint import load_model
from minigpt.config import ModelConfig
from minigpt.disagg import (DecodeKVStore, FailingChannel, GlooChannel, KVMessage, LayerRunner, QueueChannel,
                            TransferError, TransferTimeout, decode_from_blocks, prefill_and_send, prefill_then_send,
                            receive_kv)
from minigpt.disagg import receiver
from minigpt.disagg.channel import HEADER_BYTES
from minigpt.disagg.transfer_cost import kv_bytes_per_request
from minigpt.engine import cached_generation
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.model import GPT
from minigpt.parallel.launch import run_ranks
from minigpt.costmodel.calculators import ModelShape

CFG = ModelConfig(vocab_size=64, max_seq_len=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48)


def _model(seed: int = 0) -> GPT:
    """A small model with seeded weights; the global RNG is restored afterwards."""
    return seeded(seed, lambda: GPT(CFG).eval())


def _prompt(n: int, seed: int = 1, vocab: int = CFG.vocab_size) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _truth(model: GPT, prompt: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    runner = LayerRunner(model)
    x = runner.embed(prompt)
    kv = []
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)
        kv.append((k, v))
    return kv, int(runner.logits(x).argmax())


def _messages(kv, request_id: str, order, src_blocks=()) -> list[KVMessage]:
    return [KVMessage(request_id, i, kv[i][0], kv[i][1], list(src_blocks)) for i in order]


def _queue(messages: list[KVMessage]) -> QueueChannel:
    channel = QueueChannel()
    for m in messages:
        channel.send(m.request_id, m.layer, m.k, m.v, m.src_blocks)
    return channel


def _pool_state(store: DecodeKVStore) -> tuple[list[int], list[int]]:
    return sorted(store.pool.free_blocks()), list(store.pool.ref_counts)


# ------------------------------------------------------------------------------------------- the runner

def test_layer_runner_gives_the_models_last_logits() -> None:
    model, prompt = _model(), _prompt(11)
    runner = LayerRunner(model)
    x = runner.embed(prompt)
    for i in range(runner.n_layers):
        x, _, _ = runner.layer(i, x)
    with torch.no_grad():
        want = model(torch.tensor([prompt]))[0, -1]
    torch.testing.assert_close(runner.logits(x), want, atol=1e-5, rtol=1e-5)


def test_layer_runner_kv_is_what_lab01s_cache_holds_after_a_prefill() -> None:
    model, prompt = _model(), _prompt(9)
    kv, _ = _truth(model, prompt)
    cache = KVCache.for_model(model, batch_size=1, max_seq_len=len(prompt))
    with torch.no_grad():
        model(torch.tensor([prompt]), positions=cache.next_positions(len(prompt)), kv_caches=cache)
    for i, (k, v) in enumerate(kv):
        assert k.shape == (len(prompt), CFG.n_kv_heads, CFG.head_dim)
        torch.testing.assert_close(k, cache[i].k[0], atol=1e-6, rtol=1e-6, msg=f"layer {i}: k differs from lab 01's")
        torch.testing.assert_close(v, cache[i].v[0], atol=1e-6, rtol=1e-6, msg=f"layer {i}: v differs from lab 01's")


def test_layer_runner_names_a_bad_layer_index() -> None:
    runner = LayerRunner(_model())
    with pytest.raises(ValueError, match=r"layer index must be an int in \[0, 3\)"):
        runner.layer(3, runner.embed([1, 2]))


# ------------------------------------------------------------------------------------------- the producers

class _LoggedRunner:
    def __init__(self, runner: LayerRunner, log: list[str]) -> None:
        self.runner, self.log, self.n_layers = runner, log, runner.n_layers

    def embed(self, prompt):
        return self.runner.embed(prompt)

    def layer(self, i, x):
        self.log.append(f"layer {i}")
        return self.runner.layer(i, x)

    def logits(self, x):
        return self.runner.logits(x)


class _Recorder:
    def __init__(self, log: list[str]) -> None:
        self.log, self.messages = log, []

    def send(self, request_id, layer, k, v) -> None:
        self.log.append(f"send {layer}")
        self.messages.append(KVMessage(request_id, layer, k.clone(), v.clone(), []))


def _produce(producer, model, prompt):
    log: list[str] = []
    channel = _Recorder(log)
    first = producer(_LoggedRunner(LayerRunner(model), log), prompt, channel, "req-7")
    return first, log, channel.messages


@pytest.mark.parametrize("producer, order", [
    (prefill_and_send, ["layer 0", "send 0", "layer 1", "send 1", "layer 2", "send 2"]),
    (prefill_then_send, ["layer 0", "layer 1", "layer 2", "send 0", "send 1", "send 2"]),
], ids=["layer-wise", "whole request"])
def test_producer_sends_every_layers_kv_in_its_order(producer, order) -> None:
    model, prompt = _model(), _prompt(7)
    kv, _ = _truth(model, prompt)
    first, log, messages = _produce(producer, model, prompt)
    assert log == order, f"expected the calls {order}, got {log}"
    assert [m.request_id for m in messages] == ["req-7"] * 3
    for m in messages:
        assert torch.equal(m.k, kv[m.layer][0]) and torch.equal(m.v, kv[m.layer][1]), f"layer {m.layer}'s K/V differ"
    with torch.no_grad():
        assert first == int(model(torch.tensor([prompt]))[0, -1].argmax())


# ------------------------------------------------------------------------------------------- the consumer

def _receive_into_src_blocks(channel, request_id, n_layers, n_tokens, store):
    """A wrong consumer kept as a fixture: it writes where the PRODUCER kept the K/V."""
    for _ in range(n_layers):
        msg = channel.recv(1.0)
        store.write(msg.layer, msg.src_blocks, msg.k, msg.v)
    return msg.src_blocks


def test_receive_kv_builds_its_table_from_its_own_pool_not_the_src_blocks() -> None:
    model, prompt = _model(), _prompt(10)
    kv, _ = _truth(model, prompt)
    store = DecodeKVStore.for_model(model, num_blocks=12, block_size=4)
    taken = store.allocate(4)                                  # other requests hold blocks 0-3
    src = [9, 10, 11]                                          # the producer's ids, free here
    blocks = receive_kv(_queue(_messages(kv, "r", range(3), src)), "r", 3, len(prompt), store)
    assert len(blocks) == 3 and not set(blocks) & set(taken) and not set(blocks) & set(src), blocks
    assert store.num_free == 12 - 4 - 3
    for i in range(3):
        k, v = store.read(i, blocks, len(prompt))
        assert torch.equal(k, kv[i][0]) and torch.equal(v, kv[i][1]), f"layer {i} was not written to the table"
        assert not store.cache.k_pools[i][src].any(), "the producer's block ids must never be written"


def test_writing_to_the_producers_block_ids_is_refused_by_name() -> None:
    model, prompt = _model(), _prompt(10)
    kv, _ = _truth(model, prompt)
    store = DecodeKVStore.for_model(model, num_blocks=12, block_size=4)
    with pytest.raises(ValueError, match="src_blocks"):
        _receive_into_src_blocks(_queue(_messages(kv, "r", range(3), [9, 10, 11])), "r", 3, len(prompt), store)


def test_receive_kv_writes_layers_arriving_in_any_order() -> None:
    model, prompt = _model(), _prompt(6)
    kv, _ = _truth(model, prompt)
    store = DecodeKVStore.for_model(model, num_blocks=8, block_size=4)
    blocks = receive_kv(_queue(_messages(kv, "r", [2, 0, 1])), "r", 3, len(prompt), store)
    for i in range(3):
        k, v = store.read(i, blocks, len(prompt))
        assert torch.equal(k, kv[i][0]) and torch.equal(v, kv[i][1]), f"layer {i} landed in the wrong place"


@pytest.mark.parametrize("make_channel, error, message", [
    (lambda ms: FailingChannel(_queue(ms), fail_at_layer=1), TransferError, "failed at layer 1"),
    (lambda ms: _queue(ms[:2]), TransferTimeout, r"no KV message arrived within 0.05 s"),
    (lambda ms: _queue([ms[0], ms[0], ms[2]]), TransferError, "layer 0 arrived twice"),
    (lambda ms: _queue([ms[0], KVMessage("other", 1, ms[1].k, ms[1].v, [])]), TransferError,
     "waiting for request 'r', received layer 1 of request 'other'"),
], ids=["lost layer", "timeout", "duplicate layer", "another request"])
def test_a_failed_transfer_raises_and_leaves_the_pool_as_it_began(make_channel, error, message) -> None:
    model, prompt = _model(), _prompt(9)
    kv, _ = _truth(model, prompt)
    store = DecodeKVStore.for_model(model, num_blocks=8, block_size=4)
    store.allocate(2)
    before = _pool_state(store)
    with pytest.raises(error, match=message):
        receive_kv(make_channel(_messages(kv, "r", range(3))), "r", 3, len(prompt), store, timeout_s=0.05)
    assert _pool_state(store) == before, "the blocks taken for a failed transfer must all go back"


# ------------------------------------------------------------------------------------------- decoding

@pytest.mark.parametrize("producer", [prefill_and_send, prefill_then_send], ids=["layer-wise", "whole request"])
def test_decoding_from_received_blocks_equals_colocated_greedy_decoding(producer, monkeypatch) -> None:
    """The same tokens, and the decoded ones with the same log-probabilities (this random model mostly repeats its
    last token: K/V received wrong would leave the tokens as they were)."""
    model = _model(3)
    for length in (1, 4, 10):                                  # block_size 4: a full block, a partial one
        prompt = _prompt(length, seed=length)
        channel = QueueChannel()
        first = producer(LayerRunner(model), prompt, channel, "q")
        store = DecodeKVStore.for_model(model, num_blocks=16, block_size=4)
        before = _pool_state(store)
        blocks = receive_kv(channel, "q", CFG.n_layers, length, store)
        logits = record_results(monkeypatch, receiver, "paged_forward")
        tokens = [first] + decode_from_blocks(model, store, blocks, length, first, 9)
        store.free(blocks)
        sampled = record_sampling(monkeypatch, cached_generation)
        want = generate_kv_cache(model, prompt, 10, stop_token_ids=()).tokens
        assert tokens == want, f"{length}-token prompt: disaggregated {tokens}, colocated {want}"
        assert_same_steps([with_logprobs(torch.cat(logits), tokens[1:])], [sampled[0][1:]],
                            f"decoding from the received blocks ({length}-token prompt)")
        assert _pool_state(store) == before, "decode_from_blocks must free the blocks it allocated"


def test_the_course_model_decodes_the_same_tokens_after_a_transfer() -> None:
    model = load_model("target")
    for length in (5, 40):
        prompt = _prompt(length, seed=length, vocab=model.config.vocab_size)
        channel = QueueChannel()
        first = prefill_and_send(LayerRunner(model), prompt, channel, "t")
        store = DecodeKVStore.for_model(model, num_blocks=8, block_size=16)
        blocks = receive_kv(channel, "t", model.config.n_layers, length, store)
        tokens = [first] + decode_from_blocks(model, store, blocks, length, first, 7)
        assert tokens == generate_kv_cache(model, prompt, 8, stop_token_ids=()).tokens


# ------------------------------------------------------------------------------------------- two processes

def _transfer_over_gloo(comm, model: GPT, prompt: list[int]):
    with GlooChannel(1 - comm.rank, block_size=4) as channel:
        if comm.rank == 0:
            first = prefill_and_send(LayerRunner(model), prompt, channel, "req-0")
            dist.send(torch.tensor([first]), 1, tag=5)
            channel.flush()
            return channel.kv_bytes_sent, channel.header_bytes_sent, channel.messages_sent
        store = DecodeKVStore.for_model(model, num_blocks=8, block_size=4)
        blocks = receive_kv(channel, "req-0", model.config.n_layers, len(prompt), store, timeout_s=20)
        first = torch.empty(1, dtype=torch.long)
        dist.recv(first, 0, tag=5)
        tokens = [int(first)] + decode_from_blocks(model, store, blocks, len(prompt), int(first), 5)
        return channel.kv_bytes_received, channel.header_bytes_received, tokens


def test_gloo_channel_moves_the_formulas_bytes_between_two_processes() -> None:
    model, prompt = _model(), _prompt(10)
    (sent, header_sent, n_messages), (received, header_received, tokens) = run_ranks(
        _transfer_over_gloo, 2, model, prompt, backend="gloo", timeout_s=60)
    T, H, D, L = len(prompt), CFG.n_kv_heads, CFG.head_dim, CFG.n_layers
    formula = kv_bytes_per_request(ModelShape.from_config(CFG, "test"), T, 4)
    assert formula == L * 2 * T * H * D * 4
    assert sent == received == formula, f"k/v bytes sent {sent}, received {received}, formula {formula}"
    n_src = blocks_needed(T, 4)
    assert n_messages == L and header_sent == header_received == L * (HEADER_BYTES + 8 * n_src)
    assert tokens == generate_kv_cache(model, prompt, 6, stop_token_ids=()).tokens


def _stall_after_one_layer(comm, model: GPT, prompt: list[int]):
    channel = GlooChannel(1 - comm.rank)
    try:
        if comm.rank == 0:
            runner = LayerRunner(model)
            _, k, v = runner.layer(0, runner.embed(prompt))
            channel.send("slow", 0, k, v)                     # then nothing: the prefill worker is stuck
            channel.flush()
            dist.barrier()                                    # ... until the decode side has given up
            return None
        store = DecodeKVStore.for_model(model, num_blocks=8, block_size=4)
        before = _pool_state(store)
        start = time.monotonic()
        try:
            receive_kv(channel, "slow", model.config.n_layers, len(prompt), store, timeout_s=0.5)
            error = None
        except TransferTimeout as err:
            error = str(err)
        waited = time.monotonic() - start
        dist.barrier()
        return error, waited, _pool_state(store) == before
    finally:
        channel.close()
        alive = [t.name for t in threading.enumerate() if t.name.startswith("kv-")]
        assert not alive, f"channel threads outlived close: {alive}"


def test_a_gloo_timeout_is_a_clear_error_and_leaves_nothing_running() -> None:
    model, prompt = _model(), _prompt(10)
    _, (error, waited, pool_restored) = run_ranks(_stall_after_one_layer, 2, model, prompt, backend="gloo",
                                                  timeout_s=60)
    assert error is not None and "no KV message from rank 0 within 0.5 s" in error, error
    assert waited >= 0.5
    assert pool_restored, "the blocks of the timed-out request must be freed"
    assert multiprocessing.active_children() == [], "a rank outlived run_ranks"
