"""A random Hugging Face Llama through every engine of the course: greedy tokens equal transformers' `generate`.

Target: 3 layers, GQA 4/2, untied head, llama3 RoPE scaling, bf16 in 8 shards. Draft (lab 06): a second
random model, 2 layers, MQA, tied, fp16, same tokenizer. Engines: lab 01 cached generation, lab 02 paged
generation, lab 03 continuous batching, lab 06 speculative decoding, lab 07 tensor parallelism (2 gloo
ranks), lab 08 server (continuous and naive engines) through the `openai` client. About 20 s.
"""

from __future__ import annotations

import openai
import pytest
import torch
from hf_fixtures import write_random_llama

from minigpt.cache.paged import PagedKVCache
from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.paged_generation import generate_paged_batch
from minigpt.engine.request import Request
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.engine.speculative import generate_speculative
from minigpt.parallel.launch import run_ranks
from minigpt.parallel.tp_model import load_tp_model, tp_kv_cache
from minigpt.tokenizer import stop_token_ids, tokenizer_for

TEXTS = ["def add(a, b):", "Once upon a time", "Hello world! 你好"]
NEW_TOKENS = 16


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    from minigpt.timing import fixed_threads
    with fixed_threads(1):
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-engines")
    target = write_random_llama(root / "target", seed=0)
    draft = write_random_llama(root / "draft", seed=1, layers=2, hidden=32, heads=2, kv_heads=1, ffn=64,
                               dtype=torch.float16, tie=True, rope_scaling=None, shard_size="5GB")
    return target, draft


@pytest.fixture(scope="module")
def setup(folders):
    """(course target, course draft, tokenizer, prompts, transformers' greedy continuations)."""
    from transformers import LlamaForCausalLM

    target, draft = folders
    tok = tokenizer_for(target)
    prompts = [tok.encode(t) for t in TEXTS]
    hf = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    expected = []
    for p in prompts:
        out = hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=NEW_TOKENS)[0, len(p):].tolist()
        expected.append([t for t in out if t not in tok.eos_token_ids][:NEW_TOKENS])     # HF keeps the EOS it stops at
    return load_model(target), load_model(draft), tok, prompts, expected, hf


def test_hf_assisted_generation_agrees_with_hf_greedy(folders, setup):
    from transformers import LlamaForCausalLM

    *_, prompts, expected, hf = setup
    assistant = LlamaForCausalLM.from_pretrained(folders[1], dtype=torch.float32).eval()
    out = hf.generate(torch.tensor([prompts[0]]), do_sample=False, max_new_tokens=NEW_TOKENS, assistant_model=assistant)
    assert [t for t in out[0, len(prompts[0]):].tolist() if t not in (1, 2)] == expected[0]


def test_lab01_cached_generation(setup):
    model, _, tok, prompts, expected, _ = setup
    for p, want in zip(prompts, expected):
        assert generate_kv_cache(model, p, NEW_TOKENS, stop_token_ids=stop_token_ids(tok)).tokens == want


def test_lab02_paged_generation(setup):
    model, _, tok, prompts, expected, _ = setup
    outs = generate_paged_batch(model, prompts, NEW_TOKENS, stop_token_ids=stop_token_ids(tok), block_size=4)
    assert [o.tokens for o in outs] == expected


def test_lab03_continuous_batching(setup):
    model, _, tok, prompts, expected, _ = setup
    cache = PagedKVCache.for_model(model, 32, 4)
    requests = [Request(i, tuple(p), NEW_TOKENS, stop_token_ids=stop_token_ids(tok)) for i, p in enumerate(prompts)]
    res = serve(requests, Scheduler(cache.manager, SchedulerConfig(2, 8), max_model_len=model.config.max_seq_len),
                ModelRunner(model, cache).execute)
    assert [res.outputs()[i] for i in range(len(prompts))] == expected


def test_lab06_speculative_decoding(setup):
    model, draft, tok, prompts, expected, _ = setup
    for p, want in zip(prompts, expected):
        out = generate_speculative(model, draft, p, NEW_TOKENS, k=3, stop_token_ids=stop_token_ids(tok))
        assert out.tokens == want and len(out.rounds) >= 1


def _tp_worker(comm, folder, prompts, stop):
    model = load_tp_model(folder, comm)
    return [generate_kv_cache(model, p, NEW_TOKENS, stop_token_ids=stop,
                              cache=tp_kv_cache(model.config, comm.world_size, comm.rank,
                                                max_seq_len=len(p) + NEW_TOKENS)).tokens for p in prompts]


def test_lab07_tensor_parallel_on_two_gloo_ranks(folders, setup):
    *_, tok, prompts, expected, _ = setup
    results = run_ranks(_tp_worker, 2, str(folders[0]), prompts, stop_token_ids(tok), timeout_s=120)
    assert results == [expected, expected]


@pytest.mark.parametrize("engine", ["continuous", "naive"])
def test_lab08_server_through_the_openai_client(folders, setup, engine):
    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import LLMEngine
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.naive import NaiveEngine

    *_, tok, prompts, expected, hf = setup
    core = LLMEngine.from_checkpoint(folders[0]) if engine == "continuous" else NaiveEngine.from_checkpoint(folders[0])
    with serve_in_thread(create_app(AsyncLLMEngine(core, num_threads=1))) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for text, want in zip(TEXTS, expected):
            out = client.completions.create(model=core.model_name, prompt=text, max_tokens=NEW_TOKENS, temperature=0)
            assert out.choices[0].text == tok.decode(want)
        messages = [{"role": "user", "content": "Hi!"}]
        reply = client.chat.completions.create(model=core.model_name, messages=messages, max_tokens=NEW_TOKENS,
                                               temperature=0)
    from transformers import AutoTokenizer
    hf_tok = AutoTokenizer.from_pretrained(folders[0])
    ids = hf_tok(hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                 add_special_tokens=False)["input_ids"]
    out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)[0, len(ids):].tolist()
    assert reply.choices[0].message.content == hf_tok.decode(out, skip_special_tokens=True)


def test_the_server_command_takes_a_folder(folders, setup):
    """`python -m minigpt.serving --checkpoint FOLDER` (what `make serve SERVE_ARGS=...` runs) as a child process."""
    from minigpt.serving.launch import serve_subprocess

    *_, tok, prompts, expected, _ = setup
    args = ["--checkpoint", str(folders[0]), "--max-model-len", "128", "--num-blocks", "32", "--threads", "1"]
    with serve_subprocess(args) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [str(folders[0])]
        out = client.completions.create(model=str(folders[0]), prompt=TEXTS[0], max_tokens=NEW_TOKENS, temperature=0)
    assert out.choices[0].text == tok.decode(expected[0])
