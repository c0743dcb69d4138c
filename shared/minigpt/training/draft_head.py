"""Train the target's draft head (lab 06, part two): `python -m minigpt.training.draft_head` (in `make models`).

EAGLE's recipe on the course corpus, the target frozen. For a window x_0..x_{T-1} the target gives its features
f_0..f_{T-1} and next-token distributions p_0..p_{T-1}; the head reads the pairs (f_{t-1}, x_t), t = 1..T-1, and
is trained on two losses per position (Li et al. 2024):

    feature   smooth-L1(f^_t, f_t)                          run one position ahead in the target's feature space
    token     KL(p_t || softmax(lm_head(f^_t)))             draft what the target would sample

Drafting past the first token feeds the head its own f^ instead of the target's f, which it never saw in training
if trained on real features only. So each step also unrolls a second pass on the head's own (detached) predictions,
(f^_{t-1}, x_t) -> f_t, a one-step form of EAGLE-3's training-time test; both passes' losses are summed.
AdamW, warm-up and cosine decay (`minigpt.training.train.lr_at`), bfloat16 autocast, seeded; the head of the last step
is kept. The card records the data, the steps, the wall time and the acceptance by draft position measured on
held-out prompts (greedy chains of `CARD_DEPTH` drafts against the stored target).
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minigpt.checkpoint import load_card, load_model
from minigpt.engine.draft_head import DraftHead, save_draft_head, target_features
from minigpt.model import GPT
from minigpt.training.data import eval_windows, load_tokens, random_windows
from minigpt.training.train import TrainConfig, lr_at

CARD_DEPTH = 5


@dataclass(frozen=True)
class HeadRecipe:
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    token_weight: float = 1.0          # weight of the KL term against the feature term
    seed: int = 1234


def head_losses(head: DraftHead, target: GPT, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Both passes' feature and token losses on windows x (B, T), and the head's top-1 agreement with the target."""
    with torch.no_grad():
        f, logits = target_features(target, x)
        p_log = F.log_softmax(logits[:, 1:].float(), -1)
    positions = torch.arange(1, x.shape[1])
    tokens, real, goal = x[:, 1:], f[:, :-1], f[:, 1:].float()
    total, stats = 0.0, {}
    inputs = real
    for name in ("real", "own"):
        predicted, draft_logits = head(inputs, tokens, target, positions)
        feature = F.smooth_l1_loss(predicted.float(), goal)
        token = F.kl_div(F.log_softmax(draft_logits.float(), -1), p_log, log_target=True, reduction="batchmean") / tokens.shape[1]
        total = total + feature + token
        stats[f"{name}_top1"] = float((draft_logits.argmax(-1) == logits[:, 1:].argmax(-1)).float().mean())
        # the next pass reads f^_{t-1} where the target's f_{t-1} was: shift by one, the first position keeps f_0
        inputs = torch.cat([real[:, :1], predicted[:, :-1].detach().to(real.dtype)], 1)
    return total, stats


def train_head(recipe: HeadRecipe, log: bool = True) -> tuple[DraftHead, dict]:
    torch.manual_seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    target = load_model("target").eval()
    for p in target.parameters():
        p.requires_grad_(False)
    head = DraftHead(target.config)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay)
    schedule = TrainConfig(steps=recipe.steps, lr=recipe.lr, warmup=recipe.warmup)
    tokens = load_tokens("train")
    curve, t0 = [], time.perf_counter()
    progress = tqdm(range(recipe.steps), desc="train draft head", unit="step", disable=not log)
    for step in progress:
        head.train()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, schedule)
        x, _ = random_windows(tokens, recipe.batch_size, recipe.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, stats = head_losses(head, target, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), recipe.grad_clip)
        opt.step()
        if (step + 1) % 50 == 0 or step + 1 == recipe.steps:
            curve.append({"step": step + 1, "loss": round(float(loss.detach()), 4), **{k: round(v, 4) for k, v in stats.items()}})
            progress.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k: f"{v:.3f}" for k, v in stats.items()})
    summary = {**recipe.__dict__, "curve": curve, "tokens_seen": recipe.steps * recipe.batch_size * recipe.seq_len,
               "train_tokens": len(tokens), "wallclock_s": round(time.perf_counter() - t0, 1), "torch": torch.__version__,
               "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads"}
    return head.eval(), summary


@torch.no_grad()
def validation_agreement(head: DraftHead, target: GPT, windows: int = 16, seq_len: int = 256) -> dict[str, float]:
    """Top-1 agreement with the target on held-out windows, on real features and on the head's own."""
    x, _ = eval_windows(load_tokens("val"), seq_len, windows)
    _, stats = head_losses(head, target, x)
    return stats


def save_with_card(head: DraftHead, summary: dict, name: str = "draft-head") -> dict:
    """Store the head, then write its card with figures measured on the stored (bfloat16-rounded) weights."""
    from minigpt.engine.draft_head import load_draft_head
    from minigpt.engine.head_speculative import card_acceptance
    target = load_model("target").eval()
    save_draft_head(head, name, {})
    stored = load_draft_head(name)
    card = {"name": name, "target": "target", "target_sha256": load_card("target")["sha256"],
            "method": "EAGLE-style draft head: one target-shaped decoder layer over [target feature ; next token's "
                      "embedding], the target's embedding and LM head shared and frozen; feature smooth-L1 plus token KL, "
                      "on real features and on the head's own (one-step training-time test)",
            "data": "data/corpus train split, random windows", "training": summary,
            "validation_top1": {k: round(v, 4) for k, v in validation_agreement(stored, target).items()},
            "acceptance_by_position": card_acceptance(target, stored, CARD_DEPTH)}
    save_draft_head(stored, name, card)
    return card


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, help="override the recipe's step count (for quick experiments)")
    parser.add_argument("--name", default="draft-head")
    args = parser.parse_args()
    head, summary = train_head(HeadRecipe(**({"steps": args.steps} if args.steps else {})))
    card = save_with_card(head, summary, args.name)
    print(f"{args.name}: {summary['wallclock_s']:.0f}s, validation {card['validation_top1']}, "
          f"acceptance by position {card['acceptance_by_position']}")


if __name__ == "__main__":
    main()
