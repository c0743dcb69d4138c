"""AsyncLLMEngine: streams per request, abort frees blocks, a stream does not abort by itself, clean shutdown;
the naive engine serves the same greedy text through the server; INT8 weights run end to end."""

from __future__ import annotations

import asyncio
import threading

import openai
import pytest

from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.quant.linear import quantize_weight_only
from minigpt.sampling import SamplingParams
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.naive import NaiveEngine


def _engine(tiny, **config) -> LLMEngine:
    return LLMEngine(tiny, EngineConfig(num_blocks=32, block_size=8, **config))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "overlapped"])
def test_streams_abort_and_shutdown(tiny, async_scheduling):
    # the expected tokens first: the engine swaps the model's attention for each step it runs, and an overlapped
    # engine paused after 12 steps may still have its 13th in flight on its model thread, so a call of the same model
    # from this thread meanwhile would run the engine's paged attention (a CI run failed so, with an IndexError)
    want_a = generate_kv_cache(tiny, [1, 2, 3], 6).tokens
    engine = _engine(tiny, async_scheduling=async_scheduling)
    aengine = AsyncLLMEngine(engine, num_threads=1).start()

    async def scenario():
        # the engine stops stepping after 12 steps: a (6 tokens) has finished, b (80) has not, however fast the
        # machine (a fixed sleep let a fast one finish b before the test looked)
        aengine.pause(after_steps=12)
        a = aengine.stream("a", [1, 2, 3], 6)
        b = aengine.stream("b", [4, 5, 6, 7], 80)
        with pytest.raises(ValueError, match="in use"):
            aengine.stream("a", [1], 2)
        with pytest.raises(ValueError, match="context"):
            aengine.stream("c", [1] * 100, 100)
        outs_a = [o async for o in a]
        first_b = await b.__anext__()                  # b keeps running although nobody reads it now
        for _ in range(6000):
            if aengine.is_paused:
                break
            await asyncio.sleep(0.01)
        assert aengine.is_paused, "the engine never reached its 12th step"
        assert aengine.stats().num_running == 1 and aengine.stats().num_blocks_used > 0
        await aengine.abort("b")
        rest = [o async for o in b]
        return outs_a, first_b, rest
    outs_a, first_b, rest = asyncio.run(scenario())
    assert [t for o in outs_a for t in o.new_token_ids] == want_a
    assert outs_a[-1].finished and rest[-1].finish_reason == "abort"
    assert aengine.stats().num_blocks_used == 0 and aengine.stats().num_running == 0
    aengine.shutdown()
    threads = [t.name for t in threading.enumerate()]
    assert not aengine.is_running and not [t for t in threads if t.startswith(("minigpt-engine", "model-step"))]


def test_shutdown_ends_open_streams(tiny):
    aengine = AsyncLLMEngine(_engine(tiny), num_threads=1).start()

    async def scenario():
        aengine.pause()
        s = aengine.stream("x", [1, 2], 10)
        await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, aengine.shutdown)
        return [o async for o in s]
    outs = asyncio.run(scenario())
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert aengine.engine.stats().num_blocks_used == 0


def test_naive_engine_serves_the_same_greedy_text(tiny, tokenizer):
    texts = []
    for engine in (NaiveEngine(tiny, tokenizer=tokenizer, model_name="m"),
                   LLMEngine(tiny, EngineConfig(num_blocks=32, block_size=8), tokenizer=tokenizer, model_name="m")):
        with serve_in_thread(create_app(AsyncLLMEngine(engine, num_threads=1))) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            texts.append([client.completions.create(model="m", prompt=p, max_tokens=8, temperature=0).choices[0].text
                          for p in ("Once upon", "def f(x):")])
    assert texts[0] == texts[1]


@pytest.mark.parametrize("weights, bits", [("int8", 8), ("int4", 4)])
def test_quantized_weights_equal_generation_on_the_quantized_model(tiny, weights, bits):
    engine = LLMEngine(tiny, EngineConfig(num_blocks=32, block_size=8, weights=weights))
    qmodel = quantize_weight_only(tiny, 8) if bits == 8 else quantize_weight_only(tiny, 4, 32)
    (c,) = engine.generate([[3, 1, 4, 1, 5]], SamplingParams(), max_tokens=8)
    assert c.token_ids == generate_kv_cache(qmodel, [3, 1, 4, 1, 5], 8).tokens
