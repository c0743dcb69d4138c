"""The course's MoE: the trained target with each SwiGLU MLP split into experts (MoEfication) and a trained router.

    model = load_course_moe()                       # the target; layer i's MLP is model.layers[i].mlp, a SlicedMoE
    moe = model.layers[0].mlp
    y = moe_forward(x, moe.probabilities, moe.experts, moe.top_k)     # x (N, 384): what the layer's MLP computes
    loads = routing_statistics(model, tokens)      # (n_layers, E) assignments per expert: real, skewed routing

    python -m minigpt.moe.course_model              # retrain the routers (seeded), rewrite the weights and the card

How (MoEfication, Zhang et al. 2022, "MoEfication: Transformer Feed-forward Layers are Mixtures of Experts"; the same
cut is called fine-grained upcycling). The MLP is y = W_down (silu(W_gate x) * W_up x) with d_ff hidden units; it
is a sum over the units, so cutting d_ff into E slices of d_ff / E gives E smaller SwiGLU MLPs whose sum is the
dense MLP exactly:

    part_e(x) = W_down[:, S_e] (silu(W_gate[S_e] x) * W_up[S_e] x),     S_e = units e*d_ff/E .. (e+1)*d_ff/E - 1
    sum_e part_e(x) = MLP(x)

A router (a linear gate, softmax over E, top-k, weights renormalised to sum 1, as `minigpt.moe.layer.Router`)
then picks k parts per token. Since the weights sum to 1, the expert seen by `moe_forward` is k * part_e: with
equal weights 1/k the layer outputs the sum of the k chosen parts, the dense MLP minus the parts left out (and
with k = E it is the dense MLP). Only the routers are trained, the target's weights stay frozen, in two steps:

    1. imitate: each layer's router learns, on the dense model's MLP inputs, the distribution of the parts' output
       norms ||part_e(x)|| (soft cross-entropy), so its top-k are the parts that matter most for that token;
    2. distil: all routers together, on the KL divergence from the dense model's next-token distribution to the
       MoE model's (the gradient reaches a router through the weights of the experts it picked).

The stored file holds only the routers (E x d_model per layer); the experts are cut from the target on load. The
card (target-moe-router.json) records the recipe, validation perplexity of the dense model, of the MoE and of a
random router, each layer's expert load (max / mean) and the training time.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from minigpt.checkpoint import CheckpointError, load_card, load_model, sha256_file
from minigpt.model import GPT, SwiGLU
from minigpt.moe.expert_parallel import moe_forward
from minigpt.moe.layer import Expert, Router, expert_load
from minigpt.paths import data_dir
from minigpt.training.data import eval_windows, load_tokens, random_windows
from minigpt.training.evaluate import validation_loss

__all__ = ["NAME", "RouterRecipe", "RECIPE", "ScaledExpert", "SlicedMoE", "slice_mlp", "moefy", "dense_mlps", "router_paths",
           "load_course_moe", "routing_statistics", "load_summary", "random_routers", "train_routers", "main"]

NAME = "target-moe-router"
BASE = "target"


@dataclass(frozen=True)
class RouterRecipe:
    n_experts: int = 16
    top_k: int = 8
    seed: int = 1234
    imitate_windows: int = 32           # training windows whose MLP inputs the routers imitate on (step 1)
    imitate_steps: int = 300
    imitate_lr: float = 1e-2
    distil_steps: int = 120             # step 2
    distil_batch: int = 8
    seq_len: int = 256
    distil_lr: float = 3e-3


RECIPE = RouterRecipe()


# ---------------------------------------------------------------- the MoE MLP

class ScaledExpert(nn.Module):
    """x -> scale * part(x): a slice of the dense MLP, scaled by k so that weights summing to 1 add up parts."""

    def __init__(self, part: Expert, scale: float) -> None:
        super().__init__()
        self.part, self.scale = part, scale

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * self.part(x)


def slice_mlp(mlp: SwiGLU, n_experts: int) -> list[Expert]:
    """The dense MLP cut along d_ff into n_experts SwiGLU parts (copies of the weights); their sum is the MLP."""
    d_ff, d_model = mlp.w_gate.weight.shape
    if d_ff % n_experts:
        raise ValueError(f"n_experts={n_experts} does not divide d_ff={d_ff}")
    width = d_ff // n_experts
    parts = []
    for e in range(n_experts):
        units = slice(e * width, (e + 1) * width)
        part = Expert(d_model, width).to(mlp.w_gate.weight.dtype)
        with torch.no_grad():
            part.w_gate.weight.copy_(mlp.w_gate.weight[units])
            part.w_up.weight.copy_(mlp.w_up.weight[units])
            part.w_down.weight.copy_(mlp.w_down.weight[:, units])
        parts.append(part)
    return parts


class SlicedMoE(nn.Module):
    """One layer's MLP as an MoE: x (B, T, D) -> moe_forward(x, probabilities, experts, top_k), same shape.

    parts: the E slices of the dense MLP (sum = dense MLP); experts[e] = top_k * parts[e], what the router's
    renormalised weights multiply; router: `minigpt.moe.layer.Router` (gate weight (E, D), the trained part).
    """

    def __init__(self, mlp: SwiGLU, n_experts: int, top_k: int) -> None:
        super().__init__()
        d_model = mlp.w_gate.weight.shape[1]
        self.n_experts, self.top_k = n_experts, top_k
        self.parts = nn.ModuleList(slice_mlp(mlp, n_experts))
        self.experts = nn.ModuleList(ScaledExpert(part, float(top_k)) for part in self.parts)
        self.router = Router(d_model, n_experts, top_k).to(mlp.w_gate.weight.dtype)
        self.run_dense = False                  # True: every part, unweighted (the dense MLP); see dense_mlps()

    def probabilities(self, x: Tensor) -> Tensor:
        """softmax over the experts of x's gate logits, (N, E) float32."""
        return self.router.probabilities(x)

    def dense(self, x: Tensor) -> Tensor:
        """Every part, unweighted: the original dense MLP (up to the order of the additions)."""
        return sum(part(x) for part in self.parts)

    def forward(self, x: Tensor) -> Tensor:
        if self.run_dense:
            return self.dense(x)
        flat = x.reshape(-1, x.shape[-1])
        return moe_forward(flat, self.probabilities, list(self.experts), self.top_k).view_as(x)


def moefy(model: GPT, n_experts: int, top_k: int) -> GPT:
    """Replace every layer's MLP of `model` (in place) by a SlicedMoE with a zero router; returns the model."""
    for block in model.layers:
        block.mlp = SlicedMoE(block.mlp, n_experts, top_k).to(model.device)
        nn.init.zeros_(block.mlp.router.gate.weight)
    return model


def _moe_layers(model: GPT) -> list[SlicedMoE]:
    layers = [block.mlp for block in model.layers]
    if not all(isinstance(m, SlicedMoE) for m in layers):
        raise ValueError("the model's MLPs are not SlicedMoE layers: build it with load_course_moe() or moefy()")
    return layers


@contextmanager
def dense_mlps(model: GPT) -> Iterator[GPT]:
    """Inside the block the MoE model runs every part of every layer unweighted: the dense target again."""
    layers = _moe_layers(model)
    for m in layers:
        m.run_dense = True
    try:
        yield model
    finally:
        for m in layers:
            m.run_dense = False


# ---------------------------------------------------------------- stored routers

def router_paths() -> tuple[Path, Path]:
    """(weights, card): data/checkpoints/target-moe-router.{safetensors,json}."""
    base = data_dir() / "checkpoints" / NAME
    return base.with_suffix(".safetensors"), base.with_suffix(".json")


def _router_state(model: GPT) -> dict[str, Tensor]:
    return {f"layers.{i}.router.weight": m.router.gate.weight.detach().float().cpu().contiguous()
            for i, m in enumerate(_moe_layers(model))}


def load_course_moe(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    verify: bool = True) -> GPT:
    """The target with MoE MLPs and the stored routers (E and k from the card); eval mode, weights frozen."""
    weights, card_path = router_paths()
    if not weights.exists() or not card_path.exists():
        raise CheckpointError(f"{weights.name} or its card is missing; restore data/ from git or run "
                              "`python -m minigpt.moe.course_model`")
    card = json.loads(card_path.read_text())
    if verify and sha256_file(weights) != card["sha256"]:
        raise CheckpointError(f"{weights} does not match its card's sha256; restore it with git or retrain it")
    if verify and load_card(BASE)["sha256"] != card["base_sha256"]:
        raise CheckpointError(f"the routers were trained on another {BASE} checkpoint than the one in data/; "
                              "retrain them with `python -m minigpt.moe.course_model`")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights} is not a readable safetensors file ({err})") from err
    model = moefy(load_model(BASE), card["n_experts"], card["top_k"])
    for i, m in enumerate(_moe_layers(model)):
        with torch.no_grad():
            m.router.gate.weight.copy_(state[f"layers.{i}.router.weight"])
    model.requires_grad_(False)
    return model.to(device=device, dtype=dtype).eval()


# ---------------------------------------------------------------- routing statistics

@torch.no_grad()
def routing_statistics(model: GPT, tokens: Tensor, batch_size: int = 8) -> Tensor:
    """(n_layers, E) long: how many of the (token, slot) assignments of `tokens` (B, T) each layer's router gives
    each expert (every token counts k times)."""
    layers = _moe_layers(model)
    loads = torch.zeros(len(layers), layers[0].n_experts, dtype=torch.long)

    def counter(i: int):
        def hook(module: SlicedMoE, args: tuple[Tensor, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1])
            expert_ids = module.probabilities(x).topk(module.top_k, dim=-1).indices
            loads[i] += expert_load(expert_ids, module.n_experts).cpu()
        return hook

    handles = [m.register_forward_pre_hook(counter(i)) for i, m in enumerate(layers)]
    try:
        for start in range(0, tokens.shape[0], batch_size):
            model(tokens[start:start + batch_size].to(model.device))
    finally:
        for h in handles:
            h.remove()
    return loads


def load_summary(loads: Tensor) -> list[dict[str, Any]]:
    """Per layer: the load of each expert as a share of the mean, and max / mean, min / mean."""
    out = []
    for row in loads.double():
        mean = row.mean()
        out.append({"max_over_mean": round(float(row.max() / mean), 3), "min_over_mean": round(float(row.min() / mean), 3),
                    "relative_load": [round(float(v / mean), 3) for v in row]})
    return out


# ---------------------------------------------------------------- training

def random_routers(model: GPT, seed: int) -> None:
    """Gates drawn from N(0, 1/D) with a seeded generator: a router that knows nothing (the baseline)."""
    g = torch.Generator().manual_seed(seed)
    for m in _moe_layers(model):
        w = m.router.gate.weight
        with torch.no_grad():
            w.copy_(torch.randn(w.shape, generator=g) / math.sqrt(w.shape[1]))


@torch.no_grad()
def _mlp_inputs(model: GPT, tokens: Tensor) -> list[Tensor]:
    """Each layer's MLP input (the normed residual), (N, D), for tokens (B, T), with the routers bypassed."""
    inputs: list[Tensor] = []
    handles = [m.register_forward_pre_hook(lambda module, args: inputs.append(args[0].reshape(-1, args[0].shape[-1])))
               for m in _moe_layers(model)]
    try:
        with dense_mlps(model):
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    return inputs


def _imitate(model: GPT, recipe: RouterRecipe, generator: torch.Generator) -> list[float]:
    """Step 1: each router fits softmax(gate x) to the parts' normalised output norms (soft cross-entropy)."""
    tokens, _ = random_windows(load_tokens("train"), recipe.imitate_windows, recipe.seq_len, generator)
    losses = []
    for m, x in zip(_moe_layers(model), _mlp_inputs(model, tokens)):
        with torch.no_grad():
            norms = torch.stack([part(x).norm(dim=-1) for part in m.parts], dim=-1)        # (N, E)
            target = torch.zeros_like(norms).scatter_(1, norms.topk(m.top_k, dim=-1).indices, 1 / m.top_k)
        gate = m.router.gate.weight
        gate.requires_grad_(True)
        opt = torch.optim.Adam([gate], lr=recipe.imitate_lr)
        for _ in range(recipe.imitate_steps):
            loss = -(target * F.log_softmax(x @ gate.T, dim=-1)).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(round(loss.item(), 4))
    return losses


def _distil(model: GPT, recipe: RouterRecipe, generator: torch.Generator) -> list[float]:
    """Step 2: all routers on KL(dense || MoE) of the next-token distributions, the rest frozen."""
    gates = [m.router.gate.weight for m in _moe_layers(model)]
    model.requires_grad_(False)
    for w in gates:
        w.requires_grad_(True)
    opt = torch.optim.Adam(gates, lr=recipe.distil_lr)
    train = load_tokens("train")
    curve = []
    for step in range(recipe.distil_steps):
        x, _ = random_windows(train, recipe.distil_batch, recipe.seq_len, generator)
        with torch.no_grad(), dense_mlps(model):
            teacher = F.log_softmax(model(x).float(), dim=-1)
        student = F.log_softmax(model(x).float(), dim=-1)
        loss = F.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True, reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 25 == 0:
            curve.append({"step": step + 1, "kl": round(loss.item(), 4)})
    model.requires_grad_(False)
    return curve


def train_routers(recipe: RouterRecipe = RECIPE) -> tuple[GPT, dict[str, Any]]:
    """Routers for the target cut into recipe.n_experts parts, trained from the recipe's seed; (model, figures)."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(recipe.seed)
    model = moefy(load_model(BASE), recipe.n_experts, recipe.top_k)
    imitate_loss = _imitate(model, recipe, generator)
    curve = _distil(model, recipe, generator)
    return model.eval(), {"imitate_loss": imitate_loss, "curve": curve,
                          "train_wallclock_s": round(time.perf_counter() - start, 1)}


def _evaluate(model: GPT, recipe: RouterRecipe) -> dict[str, Any]:
    """Validation perplexity of the dense target, the MoE and a random router; expert loads on the validation split."""
    layers = _moe_layers(model)
    with dense_mlps(model):
        dense = validation_loss(model)
    moe = validation_loss(model)
    tokens, _ = eval_windows(load_tokens("val"), model.config.max_seq_len)
    loads = routing_statistics(model, tokens)
    trained = [m.router.gate.weight.detach().clone() for m in layers]
    random_routers(model, recipe.seed + 1)
    random = validation_loss(model)
    with torch.no_grad():
        for m, w in zip(layers, trained):
            m.router.gate.weight.copy_(w)
    return {"validation": {"tokens": moe["tokens"], "seq_len": model.config.max_seq_len,
                           "perplexity_dense": round(dense["perplexity"], 4),
                           "perplexity_moe": round(moe["perplexity"], 4),
                           "perplexity_random_router": round(random["perplexity"], 4)},
            "expert_load_validation": {"assignments_per_layer": int(loads[0].sum()), "counts": loads.tolist(),
                                       "per_layer": load_summary(loads)}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="Train the course MoE's routers and write "
                                                 f"data/checkpoints/{NAME}.{{safetensors,json}}")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, training = train_routers(RECIPE)
    figures = _evaluate(model, RECIPE)
    weights, card_path = router_paths()
    save_file(_router_state(model), str(weights))
    card = {"name": NAME, "base": BASE, "base_sha256": load_card(BASE)["sha256"],
            "method": "MoEfication: each layer's SwiGLU MLP cut along d_ff into n_experts equal slices (their sum "
                      "is the dense MLP); experts = top_k * slice; routers (softmax, top-k, renormalised) trained, "
                      "everything else frozen: step 1 imitates the slices' output norms on the dense MLP inputs, "
                      "step 2 distils from the dense model (KL of next-token distributions)",
            "n_experts": RECIPE.n_experts, "top_k": RECIPE.top_k, "expert_d_ff": model.config.d_ff // RECIPE.n_experts,
            "recipe": asdict(RECIPE), "training": {**training, "torch": torch.__version__,
                                                   "machine": f"{platform.machine()} CPU, {args.threads} threads"},
            **figures, "wallclock_s": round(time.perf_counter() - start, 1),
            "file": weights.name, "bytes": weights.stat().st_size, "sha256": sha256_file(weights)}
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return card


if __name__ == "__main__":
    card = main()
    print(json.dumps({k: card[k] for k in ("validation", "wallclock_s")}, indent=2))
    print("max/mean load per layer:", [layer["max_over_mean"] for layer in card["expert_load_validation"]["per_layer"]])
