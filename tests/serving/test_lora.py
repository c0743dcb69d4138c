"""Multi-LoRA serving (lab 08): the batched LoRA matmul, the LoRA-wrapped model, the runner, adapter files,
prefix-cache salting, the memory arithmetic."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from autograder.lab08 import SMALL_CONFIG, served_lora_model, small_model
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.paged import PagedKVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.request import Request
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.serving.lora import (LoRAAdapters, LoRALinear, lora_delta, merge_adapter, set_delta_fn, using_adapters,
                                  with_lora)
from minigpt.serving.lora_bench import adapter_bytes, hundred_adapters
from minigpt.serving.lora_runner import LoRAModelRunner, step_adapter_indices
from minigpt.costmodel.calculators import PRESETS
from minigpt.timing import fixed_threads


@pytest.fixture(scope="module")
def model():
    return small_model()


@pytest.fixture(scope="module")
def adapters(model):
    return LoRAAdapters.random(model, ["a", "b", "c"], rank=4, seed=0)


@pytest.fixture(scope="module")
def merged(model, adapters):
    return {**{a: merge_adapter(model, adapters, a) for a in range(3)}, -1: model}


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 6), st.integers(1, 9), st.integers(1, 9), st.data())
def test_lora_delta_equals_merged_rows(rows, n, r, d_in, d_out, data):
    g = torch.Generator().manual_seed(rows * 100 + n)
    x, A, B = torch.randn(rows, d_in, generator=g), torch.randn(n, r, d_in, generator=g), torch.randn(n, d_out, r, generator=g)
    idx = torch.tensor(data.draw(st.lists(st.integers(-1, n - 1), min_size=rows, max_size=rows)))
    got = lora_delta(x, A, B, idx, 0.5)
    for i in range(rows):
        a = int(idx[i])
        want = torch.zeros(d_out) if a < 0 else 0.5 * B[a] @ A[a] @ x[i]
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-5)


def test_mixed_batch_equals_merged_models(model, adapters, merged):
    lm = with_lora(model, adapters)
    assert sum(isinstance(m, LoRALinear) for m in lm.modules()) == 7 * SMALL_CONFIG.n_layers
    tokens = torch.randint(0, 255, (1, 20), generator=torch.Generator().manual_seed(0)).repeat(4, 1)
    with torch.inference_mode(), using_adapters(lm, [2, -1, 0, 1]):
        out = lm(tokens)
    with torch.inference_mode():
        for row, a in enumerate([2, -1, 0, 1]):
            want = merged[a](tokens[:1])[0]
            torch.testing.assert_close(out[row], want, rtol=1e-4, atol=1e-4)
            assert torch.equal(out[row].argmax(-1), want.argmax(-1))
        plain = lm(tokens)                     # outside the block: the base model
        torch.testing.assert_close(plain[0], model(tokens[:1])[0], rtol=1e-5, atol=1e-5)
        # the adapters really differ (else a mixed-up index would go unnoticed)
        assert not torch.equal(merged[0](tokens[:1]).argmax(-1), merged[1](tokens[:1]).argmax(-1))


def test_per_token_indices_and_bad_indices(model, adapters, merged):
    lm = with_lora(model, adapters)
    tokens = torch.randint(0, 255, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode(), using_adapters(lm, torch.tensor([[1] * 6])):
        torch.testing.assert_close(lm(tokens), merged[1](tokens), rtol=1e-4, atol=1e-4)
    for bad in ([3], [-2], torch.tensor([0.5])):
        with pytest.raises(ValueError, match="adapter indices"):
            with using_adapters(lm, bad):
                pass
    with pytest.raises(ValueError, match="no LoRA adapters"):
        with using_adapters(model, [0]):
            pass
    with pytest.raises(ValueError, match="already carries"):
        with_lora(lm, adapters, inplace=True)
    with pytest.raises(ValueError, match="unknown adapter 'zzz'"):
        merge_adapter(model, adapters, "zzz")


def test_learner_delta_fn_is_used(model, adapters):
    lm = with_lora(model, adapters)
    calls = []

    def spy(x, A, B, idx, s):
        calls.append(idx.shape)
        return lora_delta(x, A, B, idx, s)
    set_delta_fn(lm, spy)
    with torch.inference_mode(), using_adapters(lm, [0, 1]):
        lm(torch.zeros(2, 3, dtype=torch.long))
    assert len(calls) == 7 * SMALL_CONFIG.n_layers and calls[0] == (6,)


def test_save_load_roundtrip(tmp_path, model, adapters):
    path = adapters.save(tmp_path / "adapters.safetensors")
    back = LoRAAdapters.load(path, model)
    assert back.names == adapters.names and back.rank == 4 and back.alpha == adapters.alpha
    for p, (A, B) in adapters.factors.items():
        assert torch.equal(back.factors[p][0], A) and torch.equal(back.factors[p][1], B)
    from minigpt.model import GPT
    from minigpt.config import DRAFT_CONFIG
    with pytest.raises(ValueError, match="weight"):
        LoRAAdapters.load(path, GPT(DRAFT_CONFIG))
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        LoRAAdapters.load(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a stacked LoRA file"):
        LoRAAdapters.load(tmp_path / "other.safetensors")
    with pytest.raises(FileNotFoundError):
        LoRAAdapters.load(tmp_path / "missing.safetensors")


def test_adapter_validation():
    with pytest.raises(ValueError, match="distinct"):
        LoRAAdapters(["a", "a"], 4, 8.0)
    with pytest.raises(ValueError, match="rank"):
        LoRAAdapters(["a"], 0, 8.0)
    with pytest.raises(ValueError, match="should be"):
        LoRAAdapters(["a"], 2, 4.0, {"layers.0.attn.wq": (torch.zeros(1, 3, 8), torch.zeros(1, 8, 2))})


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_runner_serves_mixed_adapters_in_one_step(model, adapters, merged, layout):
    g = torch.Generator().manual_seed(4)
    shared = torch.randint(0, 255, (9,), generator=g).tolist()
    plan = [(0, shared), (1, shared), (-1, shared), (2, torch.randint(0, 255, (17,), generator=g).tolist()),
            (1, torch.randint(0, 255, (5,), generator=g).tolist())]
    reqs = [Request(i, p, 8, stop_token_ids=()) for i, (_, p) in enumerate(plan)]
    adapter_of = {i: a for i, (a, _) in enumerate(plan)}
    cache = PagedKVCache.for_model(model, 64, 4)
    runner = LoRAModelRunner(with_lora(model, adapters), cache, layout, adapter_of=lambda s: adapter_of[s.seq_id])
    with fixed_threads(1):
        res = serve(reqs, Scheduler(cache.manager, SchedulerConfig(5, 64), max_model_len=96), runner.execute)
        for seq in res.sequences:
            want = generate_kv_cache(merged[adapter_of[seq.seq_id]], list(seq.prompt), 8, stop_token_ids=()).tokens
            assert list(seq.output_tokens) == want, seq.seq_id
    assert runner.num_forward_calls == 8 and runner.num_lora_steps == 8      # every step served all five together
    assert cache.manager.pool.num_used == 0


def test_step_indices_layouts():
    class Seq:
        def __init__(self, a):
            self.request = type("R", (), {"adapter": a})()

    class Chunk:
        def __init__(self, a, n):
            self.seq, self.tokens = Seq(a), [0] * n
    chunks = [Chunk(2, 3), Chunk(-1, 1), Chunk(0, 2)]
    assert step_adapter_indices(chunks, "packed").tolist() == [[2, 2, 2, -1, 0, 0]]
    assert step_adapter_indices(chunks, "padded").tolist() == [2, -1, 0]
    assert step_adapter_indices([Chunk(-1, 4)], "packed") is None


def test_runner_needs_lora_model(model):
    with pytest.raises(ValueError, match="with_lora"):
        LoRAModelRunner(model, PagedKVCache.for_model(model, 8, 4))


def test_prefix_cache_salt_keeps_adapters_apart():
    m = BlockManager(32, 4, enable_prefix_caching=True)
    prompt = list(range(13))
    m.add_sequence("base", prompt)
    assert m.add_sequence("base2", prompt).num_cached == 12                  # unsalted: shared as before
    assert m.add_sequence("lora2", prompt, salt=("lora", 2)).num_cached == 0  # another adapter: nothing shared
    assert m.add_sequence("lora2b", prompt, salt=("lora", 2)).num_cached == 12
    assert m.add_sequence("lora1", prompt, salt=("lora", 1)).num_cached == 0
    # a block filled during decode continues the sequence's salted chain
    m2 = BlockManager(32, 4, enable_prefix_caching=True)
    m2.add_sequence("x", [1, 2, 3], salt="s")
    m2.append_tokens("x", [4, 5])
    assert m2.add_sequence("y", [1, 2, 3, 4, 5], salt="s").num_cached == 4
    assert m2.add_sequence("z", [1, 2, 3, 4, 5]).num_cached == 0
    for s in list(m.tables):
        m.free(s)
    assert not m.roots and m.pool.num_used == 0


def test_adapter_memory_arithmetic(model, adapters):
    shape = PRESETS["Llama-3-8B"]
    # per layer: wq, wo 2 * 16 * 8192; wk, wv 2 * 16 * 5120; gate, up, down 3 * 16 * 18432
    per_layer = 16 * (2 * 8192 + 2 * 5120 + 3 * 18432)
    assert adapter_bytes(shape, 16) == 32 * per_layer * 2 == 80 * 2**20
    h = hundred_adapters(shape, 16)
    assert h["total_bytes"] == 100 * 80 * 2**20 and 50 < h["percent_of_base"] < 55
    from minigpt.costmodel.calculators import ModelShape
    small = ModelShape.from_config(SMALL_CONFIG, "small")
    assert adapter_bytes(small, 4, 4) == adapters.nbytes_per_adapter()         # fp32 factors


# --- through the engine and the OpenAI-compatible server --------------------------------------------------------

@pytest.fixture(scope="module")
def served(tokenizer):
    """The serving tests' tiny model over the course vocabulary, three adapters, behind the server on loopback."""
    import openai
    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.lora_runner import engine_with_adapters

    base, ads = served_lora_model()
    engine = engine_with_adapters(base, ads, EngineConfig(num_blocks=64, block_size=8), tokenizer=tokenizer,
                                  model_name="tiny")
    aengine = AsyncLLMEngine(engine)
    with serve_in_thread(create_app(aengine, max_queue=16)) as url:
        yield base, ads, engine, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
    assert not aengine.is_running


def test_server_adapter_output_equals_merged(served, tokenizer):
    from concurrent.futures import ThreadPoolExecutor

    base, ads, engine, client = served
    prompt = "def parse(args):"
    ids = tokenizer.encode(prompt)
    names = ["adapter-2", "tiny", "adapter-0", "adapter-1", "adapter-2"]
    with ThreadPoolExecutor(len(names)) as pool:           # concurrent: the engine batches them together
        texts = list(pool.map(lambda n: client.completions.create(model=n, prompt=prompt, max_tokens=10,
                                                                  temperature=0).choices[0].text, names))
    outs = {}
    for name, text in zip(names, texts):
        ref = base if name == "tiny" else merge_adapter(base, ads, name)
        want = tokenizer.decode(generate_kv_cache(ref, ids, 10, stop_token_ids=()).tokens)
        assert text == want, name
        outs[name] = text
    assert len(set(outs.values())) >= 3                   # the adapters really change the output
    assert engine.runner.num_lora_steps > 0 and engine.stats().num_blocks_used == 0
    assert {m.id for m in client.models.list()} == {"tiny", "adapter-0", "adapter-1", "adapter-2"}


def test_server_unknown_adapter_is_404(served):
    import openai
    _, _, engine, client = served
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="adapter-9", prompt="hi", max_tokens=4)
    assert "adapter-9" in str(err.value)
    assert engine.stats().num_blocks_used == 0


def test_prefix_caching_never_shares_blocks_across_adapters(model, adapters, merged):
    """Same prompt, three adapters and the base, prefix caching on if the scheduler salts by adapter (else the
    builder turns it off): every output equals its merged model's."""
    from minigpt.engine.prefix_scheduler import PrefixCachingScheduler
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.lora_runner import engine_with_adapters

    engine = engine_with_adapters(model, adapters, EngineConfig(num_blocks=64, block_size=4, max_num_seqs=2))
    salts = getattr(PrefixCachingScheduler, "salts_by_adapter", False)
    assert engine.config.enable_prefix_caching == salts
    prompt = torch.randint(0, 255, (13,), generator=torch.Generator().manual_seed(9)).tolist()
    for i, a in enumerate([0, 1, -1, 2, 1]):          # two at a time: later ones find earlier ones' blocks cached
        engine.add_request(i, prompt, 6, adapter=a)
    got = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    for i, a in enumerate([0, 1, -1, 2, 1]):
        assert got[i] == generate_kv_cache(merged[a], prompt, 6, stop_token_ids=()).tokens, (i, a)
    if salts:
        assert engine.stats().prefix_cache_hit_rate > 0          # adapter 1's second request reused its own blocks


def test_adapters_on_int8_base(model, adapters):
    """LoRALinear wraps any projection module: the engine's INT8 weight-only base (QLoRA-style serving) works."""
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.lora_runner import engine_with_adapters

    engine = engine_with_adapters(model, adapters, EngineConfig(num_blocks=32, block_size=4, weights="int8"))
    prompt = list(range(5, 17))
    outs = engine.generate([prompt, prompt], max_tokens=6)                 # base model
    engine.add_request("lora", prompt, 6, adapter=1)
    got = []
    while engine.has_unfinished():
        got += [t for o in engine.step() for t in o.new_token_ids]
    assert outs[0].token_ids == outs[1].token_ids and len(got) == 6
    assert engine.runner.num_lora_steps >= 6 and engine.stats().num_blocks_used == 0


def test_cost_vs_width_times_the_delta_it_is_given():
    """lab 08's width sweep times the learner's delta_fn when given one (the notebook passes theirs), base and delta
    of one d x d projection at each width, and the delta's FLOP share 2r/d."""
    from minigpt.serving.lora_bench import lora_cost_vs_width
    calls = []

    def counting_delta(x, A, B, idx, s):
        calls.append(x.shape)
        return lora_delta(x, A, B, idx, s)

    rows = lora_cost_vs_width((16, 64), delta_fn=counting_delta, rows=4, rank=2, repeats=2)
    assert [r["d"] for r in rows] == [16, 64] and calls and all(shape[0] == 4 for shape in calls)
    assert [r["flop_share"] for r in rows] == [2 * 2 / 16, 2 * 2 / 64]
    assert all(r["base_s"] > 0 and r["delta_s"] > 0 for r in rows)
