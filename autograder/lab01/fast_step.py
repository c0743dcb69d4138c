"""Exercises 4 and 5: the decode step with its overhead taken out (lab 01, section 8).

    check_fuse_weights(fuse_weights)    the step's weights, made once from a state dict: fused, K-major matrices
                                        (4 a layer and the head), norms, the embedding and a RoPE table; every
                                        entry compared with what it must hold, with the likely mistake named
    check_decode_step(decode_step)      one token a call on those weights and a preallocated cache: logits equal
                                        to the model's at every position, K and V written at that position and
                                        nothing else written, no slot past it read

Both are decided on data the judge holds: the state dict goes in, the weights come back as tensors; the step
gets the judge's own fused weights (so it can only run on the fused layout: there is no other copy of the
weights to use) and the cache by value, whose every slot the judge then compares. A learner whose Exercise 4
failed can go on with `from minigpt.engine.static_decode import fuse_weights`: the step's check never uses the
learner's fusion. The package's `minigpt.engine.static_decode` (and the engine's `FusedModel`) are refused.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from autograder.checking.reference_guard import no_calls_into, own_work
from autograder.harness import assert_finite, call_learner, within
from autograder.lab01.common import ATOL
from minigpt.config import Llama3RopeScaling, ModelConfig
from minigpt.engine import static_decode
from minigpt.engine.fused_decode import FusedModel
from minigpt.engine.static_decode import MATRICES, empty_cache
from minigpt.model import GPT
from minigpt.timing import fixed_threads

FUSE_WHAT = "Exercise 4 (fuse_weights)"
STEP_WHAT = "Exercise 5 (decode_step)"
REFERENCES = (static_decode.fuse_weights, static_decode.decode_step, FusedModel)

# GQA with tied embeddings; MQA with its own head, a long RoPE base and Llama 3.1's scaling (a table the step must
# take from the weights, not recompute with the model's defaults) and a large norm epsilon (a norm without it is off).
STEP_CONFIGS = {
    "GQA 4q/2kv, tied embeddings": ModelConfig(vocab_size=256, max_seq_len=40, d_model=64, n_layers=2, n_heads=4,
                                               n_kv_heads=2, d_ff=96),
    "MQA 4q/1kv, own head, scaled RoPE": ModelConfig(
        vocab_size=192, max_seq_len=32, d_model=64, n_layers=3, n_heads=4, n_kv_heads=1, d_ff=160,
        rope_theta=500000.0, tie_embeddings=False, norm_eps=0.1,
        rope_scaling=Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=8)),
}
POISON = 1e3        # what the cache holds past the position being decoded: a step that reads those slots is off


def step_model(name: str, seed: int = 0) -> GPT:
    """A small model with weights drawn from `seed`, norms included (ones would hide a norm left out)."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():                     # the constructor's own draws leave the global RNG as it was
        model = GPT(STEP_CONFIGS[name]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim == 2 else 0.2) + (1.0 if p.ndim == 1 else 0.0))
    return model


def _state(model: GPT) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _call(fn: Callable, what: str, *args: Any) -> Any:
    """The learner's fn(*args), quiet, with the references watched and its failures turned into messages."""
    with no_calls_into(*REFERENCES, what=what):
        return call_learner(what, fn, *args)


# ---------------------------------------------------------------------------------------------- Exercise 4

def _diagnose_matrix(key: str, i: int | None, got: torch.Tensor, want: torch.Tensor, state: dict,
                     cfg: ModelConfig) -> str:
    """The likeliest mistake behind a wrong fused matrix."""
    p = f"layers.{i}."
    if tuple(got.shape) == tuple(want.shape[::-1]):
        return (f"it has shape {tuple(got.shape)}, the (out_features, in_features) of nn.Linear; keep it K-major, "
                f"(in_features, out_features) = {tuple(want.shape)}, so that x @ W streams it in memory order "
                "(transpose once, here, and make it contiguous)")
    if tuple(got.shape) != tuple(want.shape):
        return f"expected shape {tuple(want.shape)}, got {tuple(got.shape)}"
    parts = {"qkv": ("attn.wq", "attn.wk", "attn.wv"), "gate_up": ("mlp.w_gate", "mlp.w_up")}.get(key)
    if parts is not None:
        pieces = {n: state[p + n + ".weight"].t() for n in parts}
        for order in itertools.permutations(parts):
            if order != parts and torch.equal(got, torch.cat([pieces[n] for n in order], 1)):
                return (f"its columns hold {' | '.join(order)}; the step splits them as {' | '.join(parts)} "
                        f"(q first, then k, then v; gate, then up)")
    if key == "head" and not cfg.tie_embeddings and torch.equal(got, state["tok_emb.weight"].t()):
        return "it is the embedding, but this model has its own lm_head.weight (tie_embeddings=False)"
    return f"largest difference {(got.float() - want.float()).abs().max().item():.3g}"


def check_fuse_weights(fuse_fn: Callable) -> None:
    """fuse_fn(state_dict, config) -> dict with the entries of `minigpt.engine.static_decode.fuse_weights`: embed,
    attn_norm, qkv, wo, mlp_norm, gate_up, down (lists of one tensor a layer), norm, head, cos and sin."""
    own_work(fuse_fn, REFERENCES, what=FUSE_WHAT)
    for name in STEP_CONFIGS:
        model = step_model(name, seed=3)
        cfg, state = model.config, _state(model)
        want = static_decode.fuse_weights(state, cfg)
        got = _call(fuse_fn, FUSE_WHAT, _state(model), cfg)
        where = f"{FUSE_WHAT}, model {name}"
        if not isinstance(got, dict):
            raise AssertionError(f"{where}: return a dict of tensors and lists of tensors, got {type(got).__name__}")
        if missing := [k for k in want if k not in got]:
            raise AssertionError(f"{where}: the dict lacks {missing} (expected keys {list(want)})")
        for key, ref in want.items():
            items = list(enumerate(ref)) if isinstance(ref, list) else [(None, ref)]
            value = got[key]
            if isinstance(ref, list) and (not isinstance(value, (list, tuple)) or len(value) != len(ref)):
                raise AssertionError(f"{where}: {key!r} must be a list of {len(ref)} tensors (one a layer), got "
                                     f"{type(value).__name__}{f' of {len(value)}' if isinstance(value, (list, tuple)) else ''}")
            for i, r in items:
                g = value[i] if i is not None else value
                label = f"{key}[{i}]" if i is not None else key
                if not isinstance(g, torch.Tensor):
                    raise AssertionError(f"{where}: {label} must be a tensor, got {type(g).__name__}")
                tol = 1e-6 if key in ("cos", "sin") else 0.0
                if g.shape != r.shape or g.dtype != r.dtype or not within((g.float() - r.float()).abs().max().item(), tol):
                    if key in ("cos", "sin") and g.shape == r.shape:
                        hint = ("cos and sin of position x rotation frequency for every position < max_seq_len: use "
                                "minigpt.model.rope_angles(torch.arange(max_seq_len), head_dim, rope_theta, "
                                "rope_scaling), as the model does (this model has rope_theta "
                                f"{cfg.rope_theta:g}{' and rope_scaling' if cfg.rope_scaling else ''})")
                    elif key in MATRICES or key == "head":
                        hint = _diagnose_matrix(key, i, g, r, state, cfg)
                    else:
                        hint = f"expected {tuple(r.shape)} {r.dtype}, the state dict's tensor as it is"
                    raise AssertionError(f"{where}: {label} is wrong: {hint}")
                if (key in MATRICES or key == "head") and r.is_contiguous() and not g.is_contiguous():
                    raise AssertionError(f"{where}: {label} has the right values but strides {g.stride()} (a "
                                         f"transposed view keeps the old memory order); K-major means stored as "
                                         f"{tuple(r.shape)} with strides {r.stride()}: call .contiguous() after .t()")


# ---------------------------------------------------------------------------------------------- Exercise 5

def _reference_caches(w: dict, cfg: ModelConfig, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches holding `tokens` at positions [0, len(tokens)), the rest poisoned."""
    k, v = empty_cache(cfg)
    for pos, t in enumerate(tokens):
        static_decode.decode_step(w, cfg, t, pos, k, v)
    k[:, len(tokens):], v[:, len(tokens):] = POISON, -POISON
    return k, v


def check_decode_step(step_fn: Callable) -> None:
    """step_fn(w, config, token, position, k_cache, v_cache) -> logits (V,): one token at `position` on the fused
    weights `w` (the reference's), reading the caches' slots [0, position) and writing slot `position`."""
    own_work(step_fn, REFERENCES, what=STEP_WHAT)
    with fixed_threads(1):
        for m, name in enumerate(STEP_CONFIGS):
            model = step_model(name, seed=11 + m)
            cfg = model.config
            w = static_decode.fuse_weights(_state(model), cfg)
            g = torch.Generator().manual_seed(100 + m)
            S = cfg.max_seq_len
            tokens = torch.randint(0, cfg.vocab_size, (S,), generator=g).tolist()
            with torch.no_grad():
                full = model(torch.tensor([tokens]), positions=torch.arange(S))[0]       # (S, V): the model's own
            prompt = 7                                   # the caches arrive holding a prompt of 7 tokens
            k_ref, v_ref = _reference_caches(w, cfg, tokens[:prompt])
            k, v = k_ref.clone(), v_ref.clone()
            for pos in range(prompt, S):                 # to the end of the context
                where = f"{STEP_WHAT}, model {name}, position {pos} (the caches hold positions 0..{pos - 1})"
                before_k, before_v = k.clone(), v.clone()
                logits = _call(step_fn, STEP_WHAT, w, cfg, tokens[pos], pos, k, v)
                static_decode.decode_step(w, cfg, tokens[pos], pos, k_ref, v_ref)
                _check_cache_write(k, v, before_k, before_v, k_ref, v_ref, pos, where)
                if not isinstance(logits, torch.Tensor):
                    raise AssertionError(f"{where}: return the logits as a tensor (vocab,), got {type(logits).__name__}")
                logits = logits.reshape(-1) if logits.numel() == cfg.vocab_size else logits
                if tuple(logits.shape) != (cfg.vocab_size,):
                    raise AssertionError(f"{where}: expected logits of shape ({cfg.vocab_size},), got {tuple(logits.shape)}")
                assert_finite(logits, where, full[pos])
                err = (logits.float() - full[pos]).abs().max().item()
                if not within(err, ATOL):
                    raise AssertionError(f"{where}: logits differ from the model's by up to {err:.3g} (allowed {ATOL}). "
                                         + _step_hint(pos == prompt))


def _check_cache_write(k, v, before_k, before_v, k_ref, v_ref, pos: int, where: str) -> None:
    """Slot `pos` of every layer now holds the reference's K (rotated) and V; every other slot is as it was."""
    for name, got, before, ref in (("k_cache", k, before_k, k_ref), ("v_cache", v, before_v, v_ref)):
        others = torch.ones(got.shape[1], dtype=torch.bool)
        others[pos] = False
        if not torch.equal(got[:, others], before[:, others]):
            slots = sorted({int(s) for s in (got[:, others] != before[:, others]).nonzero()[:, 1].tolist()})
            slots = [s if s < pos else s + 1 for s in slots][:4]
            raise AssertionError(f"{where}: the step changed {name} at slots {slots}; write this position's keys and "
                                 f"values at slot {pos} of every layer and nothing else (the cache is preallocated "
                                 "once, for the whole context, and written in place)")
        errs = (got[:, pos].float() - ref[:, pos].float()).flatten(1).abs().amax(1)      # per layer
        bad = [layer for layer, e in enumerate(errs.tolist()) if not within(e, 1e-5)]
        if not bad:
            continue
        layer = bad[0]
        if layer == 0:
            hint = ("the keys are stored after RoPE (rotated at their own position), the values as they come out "
                    "of the projection" if name == "k_cache" else "the values as they come out of the projection")
        else:
            hint = (f"layer 0 wrote the right slot, so what reaches layer {layer} is off: look at what follows the "
                    f"write in layer {layer - 1} (attention over slots [0, position] only, the KV heads shared by "
                    "groups of query heads, the output projection, the MLP and its norm)")
        raise AssertionError(f"{where}: {name}[{layer}, {pos}] differs from what the model computes there by up to "
                             f"{errs[layer].item():.3g}: {hint}")


def _step_hint(first: bool) -> str:
    common = ("Check the split of x @ w['qkv'] into q (n_heads * head_dim), k and v (n_kv_heads * head_dim each), "
              "RoPE on q and k with w['cos'][position] and w['sin'][position] (pairs (x[i], x[i + D/2])), attention "
              "over slots [0, position] only (the slots past it hold garbage), the KV heads shared by groups of query "
              "heads (GQA), RMSNorm before each block and before the head.")
    return ("Already the first decoded position is off: " if first else "Earlier positions were right: ") + common
