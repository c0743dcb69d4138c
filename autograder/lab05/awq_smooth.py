"""Exercises 5 and 6: AWQ scales folded into the producers, SmoothQuant's migration factors."""

from __future__ import annotations

import copy
from typing import Callable

import torch

from autograder.checking.models import model_beside
from autograder.lab05.common import TINY_CONFIG, _AWQ, _SMOOTH, _call
from autograder.checking.reference_guard import own_work
from autograder.checking.wire import class_of
from minigpt.model import GPT
from minigpt.quant.awq import AWQ_GROUPS
from minigpt.quant.smoothquant import smoothing_factors


def _tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(TINY_CONFIG).eval()
    with torch.no_grad():       # norms with non-trivial weights, so folding into them is visible
        for block in model.layers:
            block.attn_norm.weight.uniform_(0.5, 1.5)
            block.mlp_norm.weight.uniform_(0.5, 1.5)
    return model


def _tiny_scales(model: GPT, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scales = {}
    for i in range(len(model.layers)):
        for projs, fold in AWQ_GROUPS:
            width = model.get_submodule(f"layers.{i}.{projs[0]}").weight.shape[1]
            scales[f"layers.{i}.{fold}"] = torch.rand(width, generator=g) * 3 + 0.25
    return scales


def check_awq_fold(fn: Callable) -> None:
    """fn(model, scales) -> a new model where, for each key "layers.i.<producer>" with s (in,), the consumers'
    weight columns are multiplied by s and the producer (a norm weight, or w_up's rows) divided by s."""
    model = _tiny_model()
    before = copy.deepcopy(model.state_dict())
    scales = _tiny_scales(model)
    own_work(fn, _AWQ, what="Exercise 5 (fold_awq_scales)")
    given = model_beside(fn, model)        # judged: a copy in the learner's kernel (the judge's cannot be deep-copied)
    new = _call(_AWQ, "Exercise 5 (fold_awq_scales)", "fold_awq_scales", fn, given,
                {k: v.clone() for k, v in scales.items()})
    if class_of(new) is not GPT and not isinstance(new, GPT):
        raise AssertionError(f"fold_awq_scales must return a GPT, got {getattr(class_of(new), '__name__', '?')}")
    given_after = given.state_dict()
    if any(not torch.equal(v, given_after[k]) for k, v in before.items()):
        raise AssertionError("fold_awq_scales modified the model it was given: work on a copy (copy.deepcopy)")
    wq = new.layers[0].attn.wq.weight.detach()
    s = scales["layers.0.attn_norm"]
    if not torch.allclose(wq, before["layers.0.attn.wq.weight"] * s[None, :], rtol=1e-5, atol=1e-7):
        raise AssertionError("layers.0.attn.wq: its input columns must be multiplied by s (W[:, j] * s_j), so the "
                             "salient channels get a finer grid once quantized")
    tokens = torch.randint(0, TINY_CONFIG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = model(tokens), new(tokens)
    if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        err = (got - want).abs().max().item()
        raise AssertionError(f"the folded model's logits differ from the original's by {err:.3g} in full precision. "
                             "Every s must be undone where the input is produced: divide the norm weight "
                             "(attn_norm, mlp_norm) by s, and w_up's output rows by s for w_down's scales.")


def _inputs_kept(ex: str, what: str, given: tuple, original: tuple) -> None:
    """The activation maxima and the weights handed in are as they were: `.float()` of a float32 tensor is that
    tensor, so an in-place op after it (abs_, clamp_) writes into the model's weights or the calibration."""
    (act, weights), (act0, weights0) = given, original
    if not torch.equal(act, act0) or any(not torch.equal(w, w0) for w, w0 in zip(weights, weights0)):
        raise AssertionError(f"{ex}: {what} changed its inputs (the activation maxima or the layer's weights): "
                             ".float() of a float32 tensor is that same tensor, so an in-place op after it (abs_, "
                             "clamp_) writes into the caller's; use the out-of-place ops (abs, clamp)")


def check_smoothing_factors(fn: Callable) -> None:
    """fn(act_absmax (in,), weights [W (out_i, in)], alpha) -> s (in,) = act^alpha / max|W[:, j]|^(1 - alpha)."""
    ex = "Exercise 6 (smoothing_factors)"
    own_work(fn, _SMOOTH, what=ex)
    g = torch.Generator().manual_seed(0)
    act = torch.rand(32, generator=g) * 10 + 0.1
    act[3] = 80.0
    weights = [torch.randn(16, 32, generator=g) * 0.05, torch.randn(8, 32, generator=g) * 0.08]  # a layer's sizes
    dead_act = act.clone()
    dead_act[7] = 0.0                               # a dead activation channel (never fires on the calibration set)
    given = (dead_act.clone(), [w.clone() for w in weights])
    s = _call(_SMOOTH, ex, "smoothing_factors with a dead channel", fn, given[0], given[1], 0.5)
    _inputs_kept(ex, "smoothing_factors with a dead channel", given, (dead_act, weights))
    if not isinstance(s, torch.Tensor) or not torch.isfinite(s).all() or not bool((s > 0).all()):
        raise AssertionError("smoothing_factors with a dead activation channel (max|x_7| = 0) must still give finite, "
                             f"positive factors (x is divided by s), got s[7] = {s[7] if isinstance(s, torch.Tensor) else s!r}"
                             ": clamp both maxima to a small positive value (1e-5) before the powers")
    for alpha in (0.5, 0.8, 0.2):
        what = f"smoothing_factors(alpha={alpha})"
        given = (act.clone(), [w.clone() for w in weights])
        s = _call(_SMOOTH, ex, what, fn, given[0], given[1], alpha)
        _inputs_kept(ex, what, given, (act, weights))
        want = smoothing_factors(act, weights, alpha)
        if not isinstance(s, torch.Tensor) or s.shape != want.shape:
            raise AssertionError(f"{what}: expected a tensor of shape {tuple(want.shape)} (one factor per input channel)")
        if not torch.allclose(s.float(), want, rtol=1e-4):
            hint = " The weight maximum is over all output rows of ALL the weights that read x (torch.cat them)." \
                if torch.allclose(s.float(), smoothing_factors(act, weights[:1], alpha), rtol=1e-4) else \
                " alpha is the exponent of the activation maximum, 1 - alpha that of the weight maximum."
            raise AssertionError(f"{what}: factors differ from max|x_j|^alpha / max|W_:,j|^(1-alpha).{hint}")
    what = "smoothing_factors(bfloat16 act_absmax and weights, alpha=0.5)"
    act16, weights16 = act.bfloat16(), [w.bfloat16() for w in weights]
    s = _call(_SMOOTH, ex, what, fn, act16.clone(), [w.clone() for w in weights16], 0.5)
    want = smoothing_factors(act16.float(), [w.float() for w in weights16], 0.5)
    if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or not torch.allclose(s, want, rtol=1e-5):
        got = s.dtype if isinstance(s, torch.Tensor) else type(s).__name__
        raise AssertionError(f"{what}: the factors must be float32 ({got} here) and computed in float32: take "
                             ".float() of the maxima before the powers (a power in bfloat16 keeps 3 digits)")
