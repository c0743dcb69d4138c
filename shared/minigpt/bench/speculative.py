"""Speculative decoding (lab 06, k = 4, the draft model) against its own greedy decode and against `transformers`'
assisted generation, on natural prompts (windows of the validation corpus), batch 1, one thread.

Six candidates, greedy, exactly `new_tokens` tokens per prompt, timed over all prompts in one interleaved `compare`:

    lab 01 generate_kv_cache          transformers generate            (greedy, the baselines)
    speculative, model as written     transformers assisted            (same draft, k = 4 per round, constant)
    fused decode step                 speculative, fused               (both models on `FusedModel`'s weights)

All six must give the same tokens. Why speculation pays what it pays, from the same run:

    alpha           accepted drafts / drafts tested                            (`measured_alpha`)
    tokens/round    measured, against E = (1 - alpha^(k+1)) / (1 - alpha)     (`expected_tokens_per_round`)
    cost model      speedup = (prefill + (n - 1) t_step) / (prefills + sum over rounds (k' t_draft + t_verify(k' + 1)))

with t_step, t_draft and t_verify(j) one target step, one draft step and a target forward over j positions, timed
alone, every one interleaved, at the mean context of the timed tokens (the prefills at the mean prompt length). What
the model calls leave out (sampling, verification, cache rollback, Python) is timed inside the loops themselves
(`Clocked`): per round of speculative decoding, per token of greedy decode.

The fused form runs `FusedModel` through `generate_speculative` unchanged: `FusedLM` gives it the .config, .device and
.dtype a model has, and the draft goes in as a `ModelDrafter` (the function wraps only a `GPT` itself).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from minigpt.bench.ledger import figure
from minigpt.cache.contiguous import KVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.fused_decode import FusedModel, generate_fused
from minigpt.engine.speculative import ModelDrafter, generate_speculative, measured_alpha
from minigpt.model import GPT
from minigpt.costmodel.speculative_calculator import expected_tokens_per_round
from minigpt.timing import compare, fixed_threads

__all__ = ["CANDIDATES", "FusedLM", "Clocked", "settings", "natural_prompts", "step_costs", "cost_model",
           "outside_model_calls", "compare_speculative", "measure_speculative", "figures", "notes"]

CANDIDATES = ("lab 01 generate_kv_cache", "fused decode step", "speculative, model as written", "speculative, fused",
              "transformers generate", "transformers assisted")
GOAL = 1.5
FORMS = {"model as written": ("speculative, model as written", "lab 01 generate_kv_cache"),
         "fused": ("speculative, fused", "fused decode step")}


def settings(quick: bool, threads: int = 1) -> dict[str, Any]:
    """8 prompts of 32-64 tokens, 64 new tokens each, 5 repeats (quick: 3 prompts, 32 new tokens, 3 repeats)."""
    return {"target": "target", "draft": "draft", "prompts": 3 if quick else 8, "prompt_lens": [32, 64],
            "new_tokens": 32 if quick else 64, "k": 4, "repeats": 3 if quick else 5, "threads": threads, "seed": 0}


class FusedLM:
    """`FusedModel(model)` with what `generate_speculative` and `ModelDrafter` read from a model besides calling it:
    .config, .device and .dtype."""

    def __init__(self, model: GPT) -> None:
        self.forward = FusedModel(model)
        self.config, self.device, self.dtype = model.config, model.device, model.dtype

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, kv_caches: Any = None) -> torch.Tensor:
        return self.forward(tokens, positions=positions, kv_caches=kv_caches)


class Clocked:
    """A model (or a `FusedLM`) whose calls add up their seconds in `.spent`: a loop's time outside them is the rest."""

    def __init__(self, model: Any) -> None:
        self.model, self.spent = model, 0.0
        self.config, self.device, self.dtype = model.config, model.device, model.dtype

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, kv_caches: Any = None) -> torch.Tensor:
        start = time.perf_counter()
        out = self.model(tokens, positions=positions, kv_caches=kv_caches)
        self.spent += time.perf_counter() - start
        return out


def natural_prompts(n: int, lengths: tuple[int, int], *, seed: int = 0) -> list[list[int]]:
    """n windows of the validation corpus at seeded random places, each lengths[0]..lengths[1] tokens long."""
    from minigpt.training.data import load_tokens

    tokens = load_tokens("val")
    rng = np.random.default_rng(seed)
    sizes = rng.integers(lengths[0], lengths[1] + 1, n)
    starts = rng.integers(0, len(tokens) - lengths[1], n)
    return [tokens[s:s + m].tolist() for s, m in zip(starts, sizes)]


@torch.inference_mode()
def step_costs(forms: dict[str, tuple[Any, Any]], context: Sequence[int], prompt_len: int, *, k: int,
               repeats: int = 9, threads: int = 1) -> dict[str, dict[str, Any]]:
    """For each form's (target, draft), median seconds of a target step, a draft step and a target forward over
    j = 1..k+1 positions, each after `context` (the cache reset to it before every call), and of both prefills of
    `prompt_len` tokens; every call of every form timed in one interleaved `compare`."""
    calls = {}
    for form, pair in forms.items():
        for role, model in zip(("target", "draft"), pair):
            cache = KVCache.for_model(model, max_seq_len=len(context) + k + 2)
            model(torch.tensor([list(context)]), positions=cache.next_positions(len(context)), kv_caches=cache)
            for j, after in [(j, len(context)) for j in (range(1, k + 2) if role == "target" else (1,))] + \
                            [(prompt_len, 0)]:
                x = torch.tensor([list(context[-j:])])

                def call(model=model, cache=cache, x=x, after=after) -> None:
                    for layer in cache:
                        layer.length = after
                    model(x, positions=cache.next_positions(x.shape[1]), kv_caches=cache)
                calls[f"{form}: {role} {'prefill' if after == 0 else j}"] = call
    t = compare(calls, warmup=2, repeats=repeats, threads=threads)
    return {form: {"target_step_s": t[f"{form}: target 1"].median, "draft_step_s": t[f"{form}: draft 1"].median,
                   "verify_s": {str(j): t[f"{form}: target {j}"].median for j in range(1, k + 2)},
                   "target_prefill_s": t[f"{form}: target prefill"].median,
                   "draft_prefill_s": t[f"{form}: draft prefill"].median, "prompt_tokens": prompt_len,
                   "samples_s": {name.split(": ", 1)[1]: timing.samples for name, timing in t.items()
                                 if name.startswith(f"{form}: ")}}
            for form in forms}


def cost_model(generations: Sequence[Any], k: int, new_tokens: int, costs: dict[str, Any]) -> dict[str, Any]:
    """What the model calls alone would take: per prompt, speculative = both prefills, the first round's k' - 1
    further draft steps (its verify is the prefill), then k' t_draft + t_verify(k' + 1) a round; greedy = the prefill
    and new_tokens - 1 steps. Alpha and tokens per full round (against the formula) from the same rounds."""
    rounds = [r for g in generations for r in g.rounds]
    alpha = measured_alpha(rounds)
    full = [r for r in rounds if len(r.drafted) == k]
    spec = 0.0
    for g in generations:
        spec += costs["target_prefill_s"] + costs["draft_prefill_s"] + max(0, len(g.rounds[0].drafted) - 1) * \
            costs["draft_step_s"]
        spec += sum(len(r.drafted) * costs["draft_step_s"] + costs["verify_s"][str(len(r.drafted) + 1)]
                    for r in g.rounds[1:])
    greedy = len(generations) * (costs["target_prefill_s"] + (new_tokens - 1) * costs["target_step_s"])
    return {"alpha": alpha, "rounds": len(rounds),
            "tokens_per_round": sum(len(r.emitted) for r in full) / max(1, len(full)),
            "formula_tokens_per_round": expected_tokens_per_round(alpha, k), "model_calls_s": spec,
            "greedy_model_calls_s": greedy, "predicted_speedup": greedy / spec}


@torch.inference_mode()
def outside_model_calls(target: Any, draft: Any, prompts: Sequence[Sequence[int]], *, new_tokens: int, k: int,
                        fused: bool, runs: int = 2, threads: int = 1) -> dict[str, float]:
    """Seconds the greedy loop spends outside its model calls per token, and speculative decoding per round (sampling,
    verification, cache rollback, Python), each measured inside the same runs (`Clocked`), so the machine's load
    drifting between runs cannot move them; `target` and `draft` are models or `FusedLM`s."""
    kw = {"stop_token_ids": ()}
    wall = {"greedy": 0.0, "speculative": 0.0}
    inside = dict(wall)
    rounds = 0
    with fixed_threads(threads):
        for _ in range(runs):
            for p in prompts:
                t = Clocked(target)
                start = time.perf_counter()
                if fused:
                    generate_fused(target, p, new_tokens, fused=t)         # a FusedLM: its config, device
                else:
                    generate_kv_cache(t, p, new_tokens, **kw)
                wall["greedy"] += time.perf_counter() - start
                inside["greedy"] += t.spent
                t, d = Clocked(target), Clocked(draft)
                start = time.perf_counter()
                g = generate_speculative(t, ModelDrafter(d, len(p) + new_tokens), p, new_tokens, k=k, **kw)
                wall["speculative"] += time.perf_counter() - start
                inside["speculative"] += t.spent + d.spent
                rounds += len(g.rounds)
    tokens = runs * len(prompts) * new_tokens
    return {"greedy_per_token_s": (wall["greedy"] - inside["greedy"]) / tokens,
            "greedy_share": 1 - inside["greedy"] / wall["greedy"],
            "speculative_per_round_s": (wall["speculative"] - inside["speculative"]) / rounds,
            "speculative_share": 1 - inside["speculative"] / wall["speculative"]}


def compare_speculative(target: GPT, draft: GPT, prompts: Sequence[Sequence[int]], *, new_tokens: int = 64, k: int = 4,
                        repeats: int = 5, threads: int = 1) -> dict[str, Any]:
    """Time the six candidates over `prompts`; tokens/s, the rounds' alpha and tokens per round, the step costs and
    the cost model's prediction, for the model as written and fused. Raises if any candidate's tokens differ."""
    from transformers.utils import logging as hf_logging

    from minigpt.hf.versus_transformers import _peer

    fused_target, fused_draft = FusedLM(target), FusedLM(draft)
    hf_target, hf_draft = _peer(target), _peer(draft, k)
    kw = {"stop_token_ids": ()}

    def hf_run(p: Sequence[int], **extra: Any) -> list[int]:
        x = torch.tensor([list(p)])
        return hf_target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                  **extra)[0, len(p):].tolist()

    runs = {
        "lab 01 generate_kv_cache": lambda: [generate_kv_cache(target, p, new_tokens, **kw).tokens for p in prompts],
        "fused decode step": lambda: [generate_fused(target, p, new_tokens, fused=fused_target.forward)
                                      for p in prompts],
        "speculative, model as written": lambda: [generate_speculative(target, draft, p, new_tokens, k=k, **kw)
                                                  for p in prompts],
        "speculative, fused": lambda: [generate_speculative(fused_target,
                                                            ModelDrafter(fused_draft, len(p) + new_tokens), p,
                                                            new_tokens, k=k, **kw) for p in prompts],
        "transformers generate": lambda: [hf_run(p) for p in prompts],
        "transformers assisted": lambda: [hf_run(p, assistant_model=hf_draft) for p in prompts],
    }
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()     # assisted generation warns about its own internal call on every run
    try:
        with torch.inference_mode(), fixed_threads(threads):
            outputs = {name: fn() for name, fn in runs.items()}
            timings = compare(runs, warmup=1, repeats=repeats, threads=threads)
    finally:
        hf_logging.set_verbosity(verbosity)
    tokens = {name: [getattr(o, "tokens", o) for o in out] for name, out in outputs.items()}
    reference = tokens["lab 01 generate_kv_cache"]
    if bad := [name for name, out in tokens.items() if out != reference]:
        raise RuntimeError(f"{', '.join(bad)} produced other tokens than lab 01's greedy decode on the same prompts")
    n = new_tokens * len(prompts)
    prompt_len = round(np.mean([len(p) for p in prompts]))
    forms_models = {"model as written": (target, draft), "fused": (fused_target, fused_draft)}
    costs = step_costs(forms_models, _context(prompts, prompt_len + new_tokens // 2), prompt_len, k=k,
                       repeats=2 * repeats + 1, threads=threads)
    forms = {}
    for form, (spec, _) in FORMS.items():
        forms[form] = {"step_costs": costs[form], **cost_model(outputs[spec], k, new_tokens, costs[form]),
                       "outside_model_calls": outside_model_calls(*forms_models[form], prompts, new_tokens=new_tokens,
                                                                  k=k, fused=form == "fused", threads=threads)}
    return {"tokens_per_s": {name: n / t.median for name, t in timings.items()},
            "samples_s": {name: t.samples for name, t in timings.items()}, "tokens_identical": True,
            "forms": forms, "settings": {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                                         "new_tokens": new_tokens, "k": k, "repeats": repeats, "threads": threads,
                                         "step_cost_context": prompt_len + new_tokens // 2}}


def measure_speculative(target: GPT, draft: GPT, *, quick: bool, threads: int = 1) -> dict[str, Any]:
    """`compare_speculative` on natural prompts; the ledger section."""
    s = settings(quick, threads)
    prompts = natural_prompts(s["prompts"], tuple(s["prompt_lens"]), seed=s["seed"])
    found = compare_speculative(target, draft, prompts, new_tokens=s["new_tokens"], k=s["k"], repeats=s["repeats"],
                                threads=threads)
    found["settings"] = {**s, **found["settings"]}
    return found


def _context(prompts: Sequence[Sequence[int]], length: int) -> list[int]:
    """A natural context of `length` tokens: the prompts one after another."""
    joined = [t for p in prompts for t in p]
    return (joined * (length // max(1, len(joined)) + 1))[:length]


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows: each speculative form against its own greedy decode (goal), assisted against generate,
    speculative against assisted, and the measured acceptance."""
    tps, k = section["tokens_per_s"], section["settings"]["k"]
    rows = []
    for form, (spec, greedy) in FORMS.items():
        rows.append(figure(f"speculative decoding, k={k}, draft model ({form})", tps[spec], "tok/s",
                           against=greedy, baseline=tps[greedy], goal=GOAL))
    rows.append(figure(f"transformers assisted generation, k={k}, same draft", tps["transformers assisted"], "tok/s",
                       against="transformers generate", baseline=tps["transformers generate"]))
    for form, (spec, _) in FORMS.items():
        rows.append(figure(f"speculative decoding, k={k}, draft model ({form})", tps[spec], "tok/s",
                           against="transformers assisted", baseline=tps["transformers assisted"]))
    alpha = section["forms"]["model as written"]["alpha"]
    rows.append(figure(f"speculative decoding: acceptance rate alpha (draft model, k={k})", 100 * alpha, "%"))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    """Why speculation pays what it pays: alpha, tokens per round against the formula, step costs, the cost model."""
    s, k = section["settings"], section["settings"]["k"]
    lines = [f"speculative decoding: {s['prompts']} validation-corpus prompts of {min(s['prompt_tokens'])}-"
             f"{max(s['prompt_tokens'])} tokens, {s['new_tokens']} new tokens each, greedy, all six candidates the "
             "same tokens."]
    for form, f in section["forms"].items():
        c, o = f["step_costs"], f["outside_model_calls"]
        measured = section["tokens_per_s"][FORMS[form][0]] / section["tokens_per_s"][FORMS[form][1]]
        lines.append(f"speculative ({form}): alpha {f['alpha']:.2f}, {f['tokens_per_round']:.2f} tokens per full "
                     f"round against {f['formula_tokens_per_round']:.2f} by the formula; target step "
                     f"{1e3 * c['target_step_s']:.2f} ms, draft step {1e3 * c['draft_step_s']:.2f} ms "
                     f"({c['draft_step_s'] / c['target_step_s']:.2f} of it, {k} a round), verify of {k + 1} positions "
                     f"{1e3 * c['verify_s'][str(k + 1)]:.2f} ms ({c['verify_s'][str(k + 1)] / c['target_step_s']:.2f} "
                     f"steps); the model calls alone predict {f['predicted_speedup']:.2f}x, measured {measured:.2f}x; "
                     f"outside the model calls a round spends {1e3 * o['speculative_per_round_s']:.2f} ms "
                     f"({o['speculative_share']:.0%} of its time: sampling, verification, cache rollback, Python), "
                     f"greedy decode {1e3 * o['greedy_per_token_s']:.2f} ms a token ({o['greedy_share']:.0%}).")
    return lines
