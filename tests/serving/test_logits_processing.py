"""Per-sequence logits processing (serving): OpenAI's logit_bias and penalties, the grammar mask, and what the
engine's batched step does with them: constrained and free requests in one batch, n choices with their own state,
a failing mask failing its request alone. Tiny seeded models, the course tokenizer (4096 tokens)."""

from __future__ import annotations

import json

import pytest
import torch
from serving_fixtures import tiny_model

from minigpt.engine.logits_processing import GrammarConstraint, LogitsProcessor
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.naive import NaiveEngine
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import TokenTrie, Vocabulary

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 99}},
          "required": ["ok", "n"]}


@pytest.fixture(scope="module")
def trie(tokenizer) -> TokenTrie:
    return TokenTrie(Vocabulary.from_tokenizer(tokenizer))


@pytest.fixture(scope="module")
def constraint(trie) -> GrammarConstraint:
    grammar = compile_json_schema(SCHEMA)
    return GrammarConstraint(grammar, ContextCache(grammar, trie).mask, trie.vocab.texts)


def test_no_processing_means_no_processor():
    assert LogitsProcessor.for_params(SamplingParams(temperature=1.0)) is None
    assert LogitsProcessor.for_params(SamplingParams(presence_penalty=0.5)) is not None


def test_bias_and_penalties_follow_openais_formula():
    logits = torch.zeros(8)
    p = LogitsProcessor(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((1, 3.0), (7, -100.0))))
    out = p(logits, [2, 2, 2, 5])
    expected = torch.zeros(8)
    expected[1], expected[7] = 3.0, -100.0
    expected[2] = -(3 * 0.25 + 0.5)
    expected[5] = -(1 * 0.25 + 0.5)
    assert torch.equal(out, expected), f"expected {expected.tolist()}, got {out.tolist()}"
    assert torch.equal(logits, torch.zeros(8)), "the raw logits must be left as they were (logprobs read them)"


def test_the_processor_catches_up_once_however_often_it_is_called():
    p = LogitsProcessor(SamplingParams(frequency_penalty=1.0))
    p(torch.zeros(4), [1])
    p(torch.zeros(4), [1])                                   # the same step re-run (fault isolation)
    out = p(torch.zeros(4), [1, 1])
    assert out[1].item() == -2.0, f"token 1 generated twice should cost 2, got {-out[1].item()}"


def test_the_grammar_masks_every_refused_token_and_allows_end_only_where_it_accepts(constraint, tokenizer):
    p = LogitsProcessor(SamplingParams(constraint=constraint))
    out = p(torch.zeros(4096), [])
    allowed = [constraint.texts[t] for t in torch.isfinite(out).nonzero().flatten().tolist()]
    assert allowed and all(text.startswith("{") for text in allowed), f"a document starts with '{{', got {allowed}"
    done = tokenizer.encode('{"ok":true,"n":12}')
    out = p(torch.zeros(4096), done)
    eos = tokenizer.eot_token
    assert torch.isfinite(out[eos]) and torch.isfinite(out).sum() == 1, "a finished object allows end-of-text alone"


def _engine(seed: int, tokenizer, **kwargs) -> LLMEngine:
    return LLMEngine(tiny_model(seed), EngineConfig(num_blocks=64, block_size=8, **kwargs), tokenizer=tokenizer)


def _run(engine, requests: dict) -> dict:
    for rid, (prompt, budget, sampling) in requests.items():
        engine.add_request(rid, prompt, budget, sampling)
    texts = {rid: "" for rid in requests}
    reasons = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] += out.text
            if out.finished:
                reasons[out.request_id] = (out.finish_reason, out.error)
    return {rid: (texts[rid], *reasons[rid]) for rid in requests}


def test_constrained_and_free_requests_share_a_batch(constraint, tokenizer):
    free = SamplingParams(temperature=1.0, seed=3)
    alone = _run(_engine(1, tokenizer), {"free": ("Once upon a time", 12, free)})
    engine = _engine(1, tokenizer)
    out = _run(engine, {"free": ("Once upon a time", 12, free),
                        **{f"json{k}": ("Reply in JSON:", 40, SamplingParams(temperature=1.0, seed=k,
                                                                             constraint=constraint)) for k in range(3)}})
    assert engine.runner.num_forward_calls < 4 * 40, "the requests were not batched"
    assert out["free"] == alone["free"], "a constrained neighbour changed a free request's output"
    for k in range(3):
        text, reason, error = out[f"json{k}"]
        assert error is None and reason == "stop", (text, reason, error)
        assert json.loads(text).keys() == {"ok", "n"} and 0 <= json.loads(text)["n"] <= 99, text


def test_choices_keep_their_own_grammar_state(constraint, tokenizer):
    """Two choices of one prompt, different seeds: each is a whole document (a shared state would break both)."""
    out = _run(_engine(2, tokenizer), {k: ("Data:", 40, SamplingParams(temperature=1.0, seed=k, constraint=constraint))
                                       for k in range(2)})
    docs = [json.loads(out[k][0]) for k in range(2)]
    assert all(d.keys() == {"ok", "n"} for d in docs), out


def test_max_tokens_cuts_a_document_with_length(constraint, tokenizer):
    out = _run(_engine(2, tokenizer), {"r": ("Data:", 3, SamplingParams(constraint=constraint))})
    text, reason, _ = out["r"]
    assert reason == "length" and compile_json_schema(SCHEMA).advance_text(
        compile_json_schema(SCHEMA).start_state(), text) is not None, out


def test_a_failing_mask_fails_its_request_alone(tokenizer, trie):
    grammar = compile_json_schema({"type": "boolean"})

    def broken(state):
        raise RuntimeError("mask exploded")
    bad = GrammarConstraint(grammar, broken, trie.vocab.texts)
    out = _run(_engine(3, tokenizer), {"bad": ("Hi", 8, SamplingParams(constraint=bad)),
                                       "good": ("Hi", 8, SamplingParams(presence_penalty=1.0))})
    assert out["bad"][1] == "abort" and "mask exploded" in out["bad"][2], out["bad"]
    assert out["good"][1] in ("stop", "length") and out["good"][2] is None, out["good"]


def test_the_naive_engine_applies_the_same_processing(constraint, tokenizer):
    engine = NaiveEngine(tiny_model(1), tokenizer=tokenizer)
    text, reason, error = _run(engine, {"r": ("Data:", 40, SamplingParams(temperature=1.0, seed=4,
                                                                          constraint=constraint))})["r"]
    assert error is None and json.loads(text).keys() == {"ok", "n"}, (text, reason)


def test_logit_bias_outside_the_vocabulary_is_refused(tokenizer):
    with pytest.raises(ValueError, match="logit_bias token id 5000"):
        _engine(0, tokenizer).add_request("r", "Hi", 4, SamplingParams(logit_bias=((5000, 1.0),)))


@pytest.mark.parametrize("kwargs", [dict(presence_penalty=float("nan")), dict(frequency_penalty=2.5),
                                    dict(logit_bias=((1, 101.0),)), dict(logit_bias=((-1, 1.0),)),
                                    dict(logit_bias=((1, float("inf")),))])
def test_out_of_range_processing_is_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
