"""Model quality on the validation split: loss, perplexity, draft/target greedy agreement, and context use
(pass keys retrieved by depth, key-value recall, a repeated passage's second reading against its first)."""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from minigpt.training.context_tasks import (ContextTask, answers_correct, haystack_tokens, kv_recall_task, passkey_task,
                                            repeated_span_task)
from minigpt.training.data import eval_windows, load_tokens
from minigpt.model import GPT


@torch.inference_mode()
def validation_loss(model: GPT, seq_len: int | None = None, max_windows: int | None = None, batch_size: int = 8) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) over non-overlapping validation windows; perplexity = exp(loss)."""
    seq_len = seq_len or model.config.max_seq_len
    x, y = eval_windows(load_tokens("val"), seq_len, max_windows)
    total = 0.0
    for i in range(0, len(x), batch_size):
        logits = model(x[i:i + batch_size].to(model.device)).float()
        total += F.cross_entropy(logits.flatten(0, 1), y[i:i + batch_size].flatten().to(model.device), reduction="sum").item()
    loss = total / y.numel()
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": y.numel()}


@torch.inference_mode()
def greedy_agreement(draft: GPT, target: GPT, seq_len: int | None = None, max_windows: int | None = None, batch_size: int = 8) -> float:
    """Fraction of validation positions where argmax(draft logits) == argmax(target logits), teacher-forced.

    Under greedy speculative decoding this is the chance that one drafted token is accepted.
    """
    seq_len = seq_len or min(draft.config.max_seq_len, target.config.max_seq_len)
    x, _ = eval_windows(load_tokens("val"), seq_len, max_windows)
    same = 0
    for i in range(0, len(x), batch_size):
        xb = x[i:i + batch_size].to(target.device)
        same += (draft(xb).argmax(-1) == target(xb).argmax(-1)).sum().item()
    return same / x.numel()


@torch.inference_mode()
def task_accuracy(model: GPT, tasks: list[ContextTask], batch_size: int = 16) -> float:
    """Fraction of tasks (all of one length) whose answer greedy decoding would print."""
    correct = 0
    for i in range(0, len(tasks), batch_size):
        part = tasks[i:i + batch_size]
        x = torch.stack([t.tokens[:-1] for t in part]).to(model.device)
        correct += sum(answers_correct(model(x).float(), part))
    return correct / len(tasks)


def passkey_accuracy(model: GPT, length: int, n: int = 32, depth: float | None = None, seed: int = 0) -> float:
    """Pass keys retrieved from `length`-token held-out texts, at `depth` (or uniform random depths)."""
    rng, haystack = random.Random(seed), haystack_tokens("val")
    return task_accuracy(model, [passkey_task(haystack, length, rng.random() if depth is None else depth, rng)
                                 for _ in range(n)])


@torch.inference_mode()
def span_perplexities(model: GPT, length: int = 512, span: int = 64, gap: int = 128, n: int = 32, seed: int = 0
                      ) -> tuple[float, float]:
    """Perplexity of a passage's first and second occurrence (predicted positions only), over n held-out texts."""
    rng, haystack = random.Random(seed), haystack_tokens("val")
    tasks = [repeated_span_task(haystack, length, span, gap, rng) for _ in range(n)]
    nll = torch.zeros(2)
    for task in tasks:
        logits = model(task.tokens[None, :-1].to(model.device)).float()[0]
        token_nll = F.cross_entropy(logits, task.tokens[1:].to(model.device), reduction="none")
        for j, start in enumerate((task.needle_at, task.answer[0])):
            nll[j] += token_nll[start:start + span - 1].mean().item()    # row p predicts token p + 1
    return tuple(float(v) for v in (nll / n).exp())


def context_use(model: GPT, depths: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                lengths: tuple[int, ...] = (128, 256, 512), n: int = 20) -> dict:
    """The model card's context figures, on held-out text: pass keys by length and depth, key-value recall among
    6 keys, and the perplexity of a repeated 64-token passage the first and the second time."""
    by_depth = {str(L): [round(passkey_accuracy(model, L, n, d, seed=1000 * L + i), 3) for i, d in enumerate(depths)]
                for L in lengths}
    rng, haystack = random.Random(7), haystack_tokens("val")
    kv = task_accuracy(model, [kv_recall_task(haystack, 512, rng.random(), rng, n_keys=6) for _ in range(64)])
    first, second = span_perplexities(model)
    return {"passkey_by_length_and_depth": {"depths": list(depths), "instances_per_cell": n, "accuracy": by_depth},
            "kv_recall_6_keys_512": round(kv, 3),
            "repeated_passage_perplexity": {"first": round(first, 2), "second": round(second, 2), "span": 64, "gap": 128}}
