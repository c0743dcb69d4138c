"""Batch-invariant inference (lab 12): the invariant matmul and attention give a row the same bits alone, in any
batch and at any place in it, and the engine's batch-invariant mode gives a request the same logits alone, batched
with others, with its prefill chunked and with a cached prefix; values equal the plain ones to rounding."""

from __future__ import annotations

import pytest
import torch

from minigpt.attention import naive_attention
from minigpt.config import ModelConfig
from minigpt.engine.batch_invariant import invariant_attention, invariant_matmul
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine

# wide enough that the BLAS blocks its products (the tiny test model's 32 columns may not show what varies)
MEDIUM = ModelConfig(vocab_size=512, max_seq_len=128, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("tile", [1, 8, 16])
def test_a_row_gets_the_same_bits_in_every_batch_and_place(tile):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 384, generator=g)
    x = torch.randn(700, 256, generator=g)
    alone = invariant_matmul(x[:1], w, tile)
    for rows in (2, 3, tile, tile + 1, 64, 700):
        batch = x[:rows].clone()
        for place in {0, rows // 2, rows - 1}:
            batch[place] = x[0]
            got = invariant_matmul(batch, w, tile)[place]
            assert torch.equal(got, alone[0]), f"tile {tile}: row 0 changed at place {place} of a batch of {rows}"
    torch.testing.assert_close(invariant_matmul(x, w, tile), x @ w, rtol=1e-5, atol=1e-4)


def test_matmul_keeps_leading_dimensions_and_refuses_a_bad_tile():
    x, w = torch.randn(2, 5, 16), torch.randn(16, 8)
    assert invariant_matmul(x, w, 4).shape == (2, 5, 8)
    for tile in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="tile"):
            invariant_matmul(x, w, tile)


def _blocks(keys: torch.Tensor, rows_of: list[int], block_size: int):
    """k_blocks for invariant_attention from per-sequence dense keys (S, L, Hkv, D) padded with zeros."""
    def get(b: int):
        chunk = keys[:, b * block_size:(b + 1) * block_size]
        return chunk[rows_of]
    return get


def test_attention_equals_causal_attention_and_is_the_same_alone_batched_and_chunked():
    g = torch.Generator().manual_seed(1)
    S, L, Hq, Hkv, D, bs = 3, 40, 4, 2, 16, 8
    k, v = torch.randn(S, 48, Hkv, D, generator=g), torch.randn(S, 48, Hkv, D, generator=g)
    q = torch.randn(S, L, Hq, D, generator=g)
    lens = [40, 23, 9]

    def run(pairs: list[tuple[int, int]]):          # (sequence, position) of each query row
        rows = [s for s, _ in pairs]
        qs = torch.stack([q[s, p] for s, p in pairs])
        positions = torch.tensor([p for _, p in pairs])
        kb = _blocks(k, rows, bs)
        vb = _blocks(v, rows, bs)
        need = int(positions.max()) // bs + 1
        return invariant_attention(qs, positions, lambda b: (kb(b), vb(b)), need, bs)

    full = run([(0, p) for p in range(lens[0])])
    want = naive_attention(q[0, :lens[0]].transpose(0, 1)[None], k[0, :lens[0]].transpose(0, 1)[None],
                           v[0, :lens[0]].transpose(0, 1)[None])[0].transpose(0, 1)
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-5)
    for chunk in (1, 7, 16):                       # the prefill in chunks: each chunk's rows alone
        pieces = [run([(0, p) for p in range(s, min(s + chunk, lens[0]))]) for s in range(0, lens[0], chunk)]
        assert torch.equal(torch.cat(pieces), full), f"chunks of {chunk} changed the bits"
    mixed = [(1, p) for p in range(lens[1])] + [(0, 39)] + [(2, p) for p in range(lens[2])] + [(0, 5)]
    out = run(mixed)
    assert torch.equal(out[lens[1]], full[39]) and torch.equal(out[-1], full[5])


def _engine(model: GPT, **config) -> tuple[LLMEngine, dict]:
    """An engine in batch-invariant mode that records each request's logits at every sampled step."""
    config = {"num_blocks": 64, "block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 64,
              "enable_prefix_caching": False, "batch_invariant": True, **config}
    engine = LLMEngine(model, EngineConfig(**config))
    logits: dict = {}
    forward = engine.runner.forward

    def recording(chunks):
        out = forward(chunks)
        for row, c in enumerate(chunks):
            if c.samples:
                logits.setdefault(c.seq_id, []).append(out[row].clone())
        return out
    engine.runner.forward = recording
    return engine, logits


def _serve(engine: LLMEngine, prompts: list[list[int]], sampling: SamplingParams, n: int = 10) -> dict:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, max_tokens=n, sampling=sampling)
    tokens: dict = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=7)],
                         ids=["greedy", "seeded"])
def test_the_engine_gives_a_request_the_same_logits_however_it_is_batched(sampling):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(MEDIUM).eval()
    g = torch.Generator().manual_seed(2)
    ours = torch.randint(0, 512, (37,), generator=g).tolist()
    others = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 50, 12)]
    engine, logits = _engine(model)
    alone_tokens = _serve(engine, [ours], sampling)["r0"]
    alone = logits["r0"]
    cases = {"batched": ({}, [ours] + others, "r0"), "batched last": ({}, others + [ours], "r3"),
             "chunked prefill": ({"max_num_batched_tokens": 6}, others[:1] + [ours], "r1"),
             "prefix cached": ({"enable_prefix_caching": True}, [ours[:20] + others[0], ours], "r1")}
    for name, (config, prompts, rid) in cases.items():
        engine, logits = _engine(model, **config)
        tokens = _serve(engine, prompts, sampling)[rid]
        assert tokens == alone_tokens, f"{name}: other tokens than alone"
        changed = [i for i, (a, b) in enumerate(zip(alone, logits[rid])) if not torch.equal(a, b)]
        assert not changed, f"{name}: the logits of steps {changed} differ from the request's alone"


def test_the_invariant_step_equals_the_plain_step_to_rounding():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(MEDIUM).eval()
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 30)]
    invariant, a = _engine(model)
    plain, b = _engine(model, batch_invariant=False)
    _serve(invariant, prompts, SamplingParams(), 6)
    _serve(plain, prompts, SamplingParams(), 6)
    for rid in a:
        for x, y in zip(a[rid], b[rid]):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_batch_invariant_mode_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="fp32"):
        EngineConfig(batch_invariant=True, weights="int8")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(MEDIUM).eval()
    with pytest.raises(ValueError, match="runner"):
        LLMEngine(model, EngineConfig(num_blocks=16, batch_invariant=True), runner_factory=lambda m, c: None)


def test_the_dense_form_pads_the_last_block_and_equals_the_blockwise_one():
    from minigpt.engine.batch_invariant import invariant_attention_dense

    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 4, 8, generator=g), torch.randn(3, 13, 2, 8, generator=g), torch.randn(3, 13, 2, 8, generator=g)
    positions = torch.tensor([12, 0, 6])
    got = invariant_attention_dense(q, positions, k, v, 4)
    for n, p in enumerate(positions.tolist()):
        want = naive_attention(q[n][None, :, None], k[n, :p + 1].transpose(0, 1)[None], v[n, :p + 1].transpose(0, 1)[None])
        torch.testing.assert_close(got[n], want[0, :, 0], rtol=1e-5, atol=1e-5)
