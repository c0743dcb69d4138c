"""The tasks that need context (minigpt.training.context_tasks) and the retrieval grid built on them."""

from __future__ import annotations

import random

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.longctx.retrieval import context_policies, retrieval_grid, task_instances
from minigpt.model import GPT
from minigpt.tokenizer import load_tokenizer
from minigpt.training.context_tasks import (ANSWER_WEIGHT, TASK_MIX, answers_correct, haystack_tokens, kv_recall_task,
                                            passkey_task, random_repeat_task, repeated_span_task, task_batch)
from minigpt.training.data import load_tokens

TINY = ModelConfig(vocab_size=4096, max_seq_len=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)


@pytest.fixture(scope="module")
def haystack():
    return haystack_tokens("val")


@pytest.mark.parametrize("length,depth", [(64, 0.0), (200, 0.5), (512, 1.0)])
def test_passkey_is_planted_at_its_depth_and_asked_at_the_end(haystack, length, depth):
    task = passkey_task(haystack, length, depth, random.Random(0))
    enc = load_tokenizer()
    assert task.tokens.shape == (length,) and task.answer[1] == length
    key = enc.decode(task.tokens[task.answer[0]:].tolist()).strip()
    assert len(key) == 5 and key.isdigit()
    text = enc.decode(task.tokens.tolist())
    assert text.count(key) == 2 and text.rstrip().endswith(f"The pass key is {key}")
    room = length - (task.answer[1] - task.answer[0]) - len(enc.encode(" What is the pass key? The pass key is"))
    needle = len(enc.encode(f" The pass key is {key}. Remember it."))
    assert abs(task.needle_at - depth * (room - needle)) <= 1


def test_kv_recall_asks_one_of_several_keys(haystack):
    task = kv_recall_task(haystack, 300, 0.3, random.Random(1), n_keys=5)
    text = load_tokenizer().decode(task.tokens.tolist())
    assert text.count(" is ") >= 5 and "What is key" in text


def test_repeats_repeat(haystack):
    task = repeated_span_task(haystack, 256, 32, 40, random.Random(2))
    a, b = task.needle_at, task.answer[0]
    assert b - a == 72 and torch.equal(task.tokens[a:a + 32], task.tokens[b:b + 32])
    rnd = random_repeat_task(haystack, 100, 16, random.Random(3))
    assert torch.equal(rnd.tokens[:16], rnd.tokens[16:32]) and rnd.answer == (16, 100)


def test_too_short_a_text_is_refused(haystack):
    with pytest.raises(ValueError, match="too short"):
        passkey_task(haystack, 20, 0.5, random.Random(0))


def test_a_batch_weighs_answers_and_is_seeded():
    tokens, haystack = load_tokens("train"), haystack_tokens("train")
    x, y, w = task_batch(tokens, haystack, 128, random.Random(7))
    assert x.shape == y.shape == w.shape == (sum(TASK_MIX.values()), 128)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert (w == ANSWER_WEIGHT).sum() > 0 and set(w.unique().tolist()) == {1.0, ANSWER_WEIGHT}
    x2, _, _ = task_batch(tokens, haystack, 128, random.Random(7))
    assert torch.equal(x, x2)


def test_answers_correct_is_greedy_decoding(haystack):
    task = passkey_task(haystack, 80, 0.5, random.Random(0))
    logits = torch.zeros(1, 80, 4096)
    logits[0, torch.arange(79), task.tokens[1:]] = 1.0           # a model that always predicts the next token
    assert answers_correct(logits, [task]) == [True]
    logits[0, task.answer[1] - 2, task.tokens[-1]] = 0.0          # the last answer token missed
    assert answers_correct(logits, [task]) == [False]


def test_instances_depend_on_their_cell_alone():
    a = task_instances("passkey", 128, 0.5, 3)
    b = task_instances("passkey", 128, 0.5, 2)
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(a, b))
    assert not torch.equal(a[0].tokens, task_instances("passkey", 128, 0.25, 1)[0].tokens)


def test_retrieval_grid_shapes_and_policies():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    policies = context_policies(TINY, factor=4.0, window=32)
    assert list(policies) == ["none", "pi", "ntk", "yarn", "yarn, no temperature", "yarn, index ramp", "window 32",
                              "4 sinks + window 28"]
    assert policies["yarn"].logit_scale > 1.0 == policies["yarn, no temperature"].logit_scale
    assert policies["yarn, index ramp"].logit_scale == policies["yarn"].logit_scale
    assert not torch.equal(policies["yarn, index ramp"].inv_freq, policies["yarn"].inv_freq)
    grid = retrieval_grid(model, policies["window 32"], lengths=[64, 128], depths=[0.0, 1.0], n=2)
    assert len(grid.accuracy) == 2 and all(len(row) == 2 for row in grid.accuracy)
    assert grid.band_edges == [0, 64, 127]
    assert all(0 <= a <= 1 for row in grid.accuracy for a in row) and len(grid.band_perplexity) == len(grid.band_edges) - 1


def test_training_with_tasks_is_seeded_and_records_its_curve():
    from minigpt.training.train import TrainConfig, train_model
    cfg = ModelConfig(vocab_size=4096, max_seq_len=192, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)
    tc = TrainConfig(steps=2, seq_len=192, warmup=1, eval_every=2, eval_windows=2, context_tasks=True, keep_best=False)
    (a, summary), (b, _) = train_model(cfg, tc, log=False), train_model(cfg, tc, log=False)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert summary["task_mix"] == TASK_MIX and summary["answer_weight"] == ANSWER_WEIGHT
    assert [p["step"] for p in summary["curve"]] == [2] and 0 <= summary["curve"][0]["passkey"] <= 1
    with pytest.raises(ValueError, match="batch_size"):
        train_model(cfg, TrainConfig(steps=1, batch_size=8, seq_len=192, context_tasks=True), log=False)


def test_the_stored_grid_is_target_long_s_and_whole():
    from minigpt.checkpoint import load_card
    from minigpt.longctx.retrieval import GRID_DEPTHS, GRID_LENGTHS, GRID_N, stored_grid
    stored = stored_grid()
    assert stored["model"] == "target-long" and stored["model_sha256"] == load_card("target-long")["sha256"]
    assert stored["n_per_cell"] == GRID_N
    assert [g["policy"] for g in stored["grids"]] == ["none", "pi", "ntk", "yarn", "yarn, no temperature",
                                                      "yarn, index ramp", "window 128", "4 sinks + window 124"]
    for grid in stored["grids"]:
        assert grid["lengths"] == list(GRID_LENGTHS) and grid["depths"] == list(GRID_DEPTHS)
