"""Train the course models (seeded, reproducible): `python -m minigpt.training.train target` then `... draft`.

AdamW with linear warm-up and cosine decay, bfloat16 autocast, gradient clipping; the weights with
the best validation loss (checked every `eval_every` steps) are kept. The draft can be distilled from
the target: its loss is (1 - a) * cross-entropy(data) + a * KL(target || draft), which raises how often
the two agree, which is what speculative decoding needs.

`target-long` starts from the target's weights and goes on training on the corpus mixed with tasks that can only be
solved by reading far back (`minigpt.training.context_tasks`: pass keys at random depths, key-value recall, repeated
passages and repeated random tokens; answer tokens weigh more in the loss); it keeps its last weights, and its
card adds retrieval by depth and the induction figures.

Every card's `training.curve` lists, every `eval_every` steps, the validation loss on `eval_windows` windows (and
for `target-long` the pass keys retrieved from 32 held-out 512-token texts at random depths).
"""

from __future__ import annotations

import argparse
import copy
import math
import platform
import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minigpt.checkpoint import load_model, save_checkpoint
from minigpt.config import DRAFT_CONFIG, TARGET_CONFIG, ModelConfig
from minigpt.model import GPT
from minigpt.training.context_tasks import ANSWER_WEIGHT, TASK_MIX, haystack_tokens, task_batch
from minigpt.training.data import load_tokens, random_windows
from minigpt.training.evaluate import context_use, greedy_agreement, passkey_accuracy, validation_loss


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 16
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_windows: int = 32
    distill_from: str | None = None   # checkpoint name of a teacher
    distill_weight: float = 0.5
    seed: int = 1234
    init_from: str | None = None      # checkpoint name to start from (else a seeded initialisation)
    context_tasks: bool = False       # mix in minigpt.training.context_tasks (TASK_MIX per batch of 16)
    keep_best: bool = True            # keep the weights with the best validation loss (else the last ones)


RECIPES: dict[str, tuple[ModelConfig, TrainConfig]] = {
    "target": (TARGET_CONFIG, TrainConfig(steps=600, lr=2e-3)),
    "draft": (DRAFT_CONFIG, TrainConfig(steps=800, lr=3e-3, distill_from="target", distill_weight=0.9)),
    "target-long": (TARGET_CONFIG, TrainConfig(steps=500, lr=1.5e-3, warmup=30, eval_every=50, init_from="target",
                                               context_tasks=True, keep_best=False)),
}


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    progress = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(model_cfg: ModelConfig, tc: TrainConfig, log: bool = True) -> tuple[GPT, dict]:
    """Train from a seeded initialisation (or `init_from`); returns the best (or last) weights and a summary."""
    torch.manual_seed(tc.seed)
    gen = torch.Generator().manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    model = GPT(model_cfg) if tc.init_from is None else load_model(tc.init_from).float()
    teacher = load_model(tc.distill_from) if tc.distill_from else None
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95))
    tokens = load_tokens("train")
    haystack = haystack_tokens("train") if tc.context_tasks else None
    if tc.context_tasks and tc.batch_size != sum(TASK_MIX.values()):
        raise ValueError(f"context_tasks needs batch_size {sum(TASK_MIX.values())} (TASK_MIX), got {tc.batch_size}")
    best_loss, best_state, best_step, curve = float("inf"), None, -1, []
    t0 = time.perf_counter()
    progress = tqdm(range(tc.steps), desc=f"train {model_cfg.n_layers}-layer", unit="step", disable=not log)
    for step in progress:
        model.train()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc)
        if tc.context_tasks:
            x, y, weight = task_batch(tokens, haystack, tc.seq_len, rng)
        else:
            (x, y), weight = random_windows(tokens, tc.batch_size, tc.seq_len, gen), None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x).float()
            if weight is None:
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            else:                                     # weighted mean: answer tokens count ANSWER_WEIGHT times
                token_loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
                loss = (token_loss * weight.flatten()).sum() / weight.sum()
            if teacher is not None:
                with torch.no_grad():
                    teacher_logp = F.log_softmax(teacher(x).float(), -1)
                kl = F.kl_div(F.log_softmax(logits, -1), teacher_logp, log_target=True, reduction="batchmean") / tc.seq_len
                loss = (1 - tc.distill_weight) * loss + tc.distill_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
            model.eval()
            val = validation_loss(model, tc.seq_len, tc.eval_windows)["loss"]
            if val < best_loss or not tc.keep_best:
                best_loss, best_state, best_step = val, copy.deepcopy(model.state_dict()), step + 1
            extra = {"passkey": f"{passkey_accuracy(model, tc.seq_len, n=32):.2f}"} if tc.context_tasks else {}
            curve.append({"step": step + 1, "val_loss": round(val, 4), **{k: float(v) for k, v in extra.items()}})
            progress.set_postfix(train=f"{loss.item():.3f}", val=f"{val:.3f}", lr=f"{lr_at(step, tc):.2e}", **extra)
            if log and tc.context_tasks:
                print(f"step {step + 1}: train {loss.item():.3f} val {val:.3f} " + " ".join(f"{k} {v}" for k, v in extra.items()),
                      flush=True)
    model.load_state_dict(best_state)
    tasks = {"task_mix": TASK_MIX, "answer_weight": ANSWER_WEIGHT} if tc.context_tasks else {}
    summary = {**tc.__dict__, **tasks, "curve": curve, "best_step": best_step, "tokens_seen": tc.steps * tc.batch_size * tc.seq_len,
               "train_tokens": len(tokens), "wallclock_s": round(time.perf_counter() - t0, 1), "torch": torch.__version__,
               "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads"}
    return model.eval(), summary


def train_and_save(name: str, model_cfg: ModelConfig, tc: TrainConfig) -> GPT:
    """Train, store in data/checkpoints/<name>.*, and write the card with figures measured on the stored weights."""
    model, summary = train_model(model_cfg, tc)
    save_checkpoint(model, name, {})
    stored = load_model(name)          # evaluate exactly what is stored (bfloat16-rounded weights)
    val = validation_loss(stored)
    card = {"name": name, "training": summary,
            "validation": {"loss": round(val["loss"], 5), "perplexity": round(val["perplexity"], 4), "tokens": val["tokens"],
                           "seq_len": stored.config.max_seq_len, "dtype": "float32"}}
    if name == "draft":
        card["greedy_agreement_with_target"] = round(greedy_agreement(stored, load_model("target")), 5)
    if tc.context_tasks:
        card["context_use"] = context_use(stored)
    save_checkpoint(stored, name, card)
    print(f"{name}: {stored.num_parameters():,} parameters, val loss {val['loss']:.4f}, ppl {val['perplexity']:.2f}, "
          f"{summary['wallclock_s']:.0f}s")
    return stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="+", choices=sorted(RECIPES))
    parser.add_argument("--steps", type=int, help="override the recipe's step count (for quick experiments)")
    args = parser.parse_args()
    for name in args.names:
        model_cfg, tc = RECIPES[name]
        if args.steps:
            tc = TrainConfig(**{**tc.__dict__, "steps": args.steps})
        train_and_save(name, model_cfg, tc)


if __name__ == "__main__":
    main()
