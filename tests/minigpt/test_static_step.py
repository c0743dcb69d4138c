"""Static shapes and a compiled decode step (lab 12): batch-size buckets, the engine's logits to rounding with the
static step eager or compiled, one compilation per bucket and none after warm-up whatever the batch sizes, and
padding rows that touch no real sequence's K/V."""

from __future__ import annotations

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.engine.static_step import StaticDecodeStep, bucket_for
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine

CONFIG = ModelConfig(vocab_size=512, max_seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> GPT:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return GPT(CONFIG).eval()


def test_bucket_is_the_smallest_that_holds_the_batch():
    assert [bucket_for(n, (1, 2, 4, 8)) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(9, (1, 2, 4, 8))


def _recorded(engine: LLMEngine) -> dict:
    logits: dict = {}
    compute = engine.runner.compute

    def recording(step):
        out = compute(step)
        logits.setdefault("steps", []).append((type(step.batch).__name__, out.clone()))
        return out
    engine.runner.compute = recording
    return logits


def _workload() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 17, 3, 30, 9)]


@pytest.mark.parametrize("static, dtype", [("eager", torch.float32), ("compiled", torch.float32),
                                           ("eager", torch.bfloat16)])        # bf16: the GPU tier's dtype
def test_static_decode_gives_the_engines_logits_and_compiles_once_per_bucket(model, static, dtype):
    import copy

    config = {"num_blocks": 40, "block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 32,
              "compile_backend": "eager"}
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    model = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
    plain, ours = LLMEngine(model, EngineConfig(**config)), LLMEngine(model, EngineConfig(static_decode=static, **config))
    want, got = _recorded(plain), _recorded(ours)
    budgets = [6, 14, 3, 9, 12]
    for engine in (plain, ours):
        for i, (prompt, n) in enumerate(zip(_workload(), budgets)):
            engine.add_request(f"r{i}", prompt, max_tokens=n, sampling=SamplingParams())
        while engine.has_unfinished():
            engine.step()
    kinds = {kind for kind, _ in got["steps"]}
    assert "StaticInputs" in kinds, "no decode step ran on the static step"
    assert len(want["steps"]) == len(got["steps"])
    for (_, a), (_, b) in zip(want["steps"], got["steps"]):
        torch.testing.assert_close(b, a, rtol=tolerance, atol=tolerance)
    step = ours.runner.static
    assert ours.cache.manager.pool.num_used == 1, "only the null block stays allocated"
    if static == "compiled":
        used = step.compilations
        assert 1 <= used <= len(step.buckets)
        for i, prompt in enumerate(_workload()):                       # batch sizes 5 .. 1 again: nothing new
            ours.add_request(f"again{i}", prompt, max_tokens=7, sampling=SamplingParams())
        while ours.has_unfinished():
            ours.step()
        assert step.compilations == used, "a bucket compiled again after warm-up"


def test_every_compiled_step_of_a_process_compiles_its_own_buckets(model, capfd):
    """torch.compile keeps at most 8 graphs per code object: steps sharing one would stop compiling (and warn on
    stderr) from the ninth step a process makes. Twelve engines here: each compiles, nothing warns."""
    counts = []
    for n in range(12):
        engine = LLMEngine(model, EngineConfig(num_blocks=16, block_size=8, max_num_seqs=2, static_decode="compiled",
                                               compile_backend="eager"))
        engine.add_request(f"r{n}", [1, 2, 3], max_tokens=3, sampling=SamplingParams())
        while engine.has_unfinished():
            engine.step()
        counts.append(engine.runner.static.compilations)
    assert counts == [1] * 12
    assert "recompile_limit" not in capfd.readouterr().err
    with pytest.raises(ValueError, match="at most"):
        StaticDecodeStep(model, LLMEngine(model, EngineConfig(num_blocks=4, block_size=8)).cache,
                         buckets=tuple(range(1, 20)), compile=True)


def test_padding_rows_write_only_the_null_block(model):
    engine = LLMEngine(model, EngineConfig(num_blocks=16, block_size=8, max_num_seqs=4, static_decode="eager"))
    for i, prompt in enumerate(_workload()[:3]):
        engine.add_request(f"r{i}", prompt, max_tokens=4, sampling=SamplingParams())
    engine.step()                                           # the three prefills (32 tokens fit one step)
    step = engine.runner.static
    out = engine.scheduler.schedule()
    inputs = step.inputs(out.chunks)                        # three decodes, padded to the bucket of 4
    assert len(inputs.tokens) == 4 and inputs.batch == 3
    before = [p.clone() for p in engine.cache.k_pools + engine.cache.v_pools]
    step(inputs)
    written = {c.slots[0] for c in out.chunks} | set(range(step.null_block * 8, step.null_block * 8 + 8))
    for old, new in zip(before, engine.cache.k_pools + engine.cache.v_pools):
        rows_old, rows_new = old.view(-1, *old.shape[2:]), new.view(-1, *new.shape[2:])
        changed = {r for r in range(rows_old.shape[0]) if not torch.equal(rows_old[r], rows_new[r])}
        assert changed <= written, f"the step wrote pool rows {sorted(changed - written)} it was not given"


def test_static_decode_is_refused_where_it_cannot_run(capsys):
    from minigpt.serving.__main__ import main

    for bad in ({"static_decode": "graphs"}, {"static_decode": "eager", "weights": "int8"},
                {"static_decode": "compiled", "batch_invariant": True}):
        with pytest.raises(ValueError, match="static_decode"):
            EngineConfig(**bad)
    for argv, why in ((["--static-decode", "eager", "--weights", "int8"], "static_decode needs fp32"),
                      (["--static-decode", "eager", "--engine", "naive"], "continuous engine only"),
                      (["--static-decode", "compiled", "--lora-adapters", "x.safetensors"], "LoRA adapters")):
        assert main(argv) == 2, argv                        # refused before any checkpoint is read
        assert why in capsys.readouterr().err


def test_padded_inputs_have_the_buckets_shapes_and_padding_points_at_the_null_block():
    from minigpt.engine.static_step import DecodeRow, pad_decode_batch

    rows = [DecodeRow(7, 9, 21, [2, 3]), DecodeRow(5, 0, 40, [5])]
    out = pad_decode_batch(rows, 4, 3, 0, 8)
    assert {k: tuple(v.shape) for k, v in out.items()} == {"tokens": (4,), "positions": (4,), "slots": (4,),
                                                          "block_tables": (4, 3), "seq_lens": (4,)}
    assert out["tokens"].tolist() == [7, 5, 0, 0] and out["seq_lens"].tolist() == [10, 1, 1, 1]
    assert out["slots"].tolist() == [21, 40, 0, 0]
    assert out["block_tables"].tolist() == [[2, 3, 0], [5, 0, 0], [0, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="bucket"):
        pad_decode_batch(rows, 1, 3, 0, 8)
