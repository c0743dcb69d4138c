"""Speculative decoding (lab 06, k = 4, the draft model; lab 06 part two, the draft head) against its own greedy
decode and against `transformers`' assisted generation, on natural prompts (windows of the validation corpus), batch 1,
one thread.

Ten candidates, greedy, exactly `new_tokens` tokens per prompt, timed over all prompts in one interleaved `compare`:

    lab 01 generate_kv_cache          transformers generate            (greedy, the baselines)
    speculative, model as written     transformers assisted            (same draft, k = 4 per round, constant)
    fused decode step                 speculative, fused               (both models on `FusedModel`'s weights)
    draft head, chain of 2 and of 4   draft head, trees (3, 2, 2) and (4, 2, 2)   (`generate_with_head`, `HEAD_SHAPES`)

All of them must give the same tokens. Why speculation pays what it pays, from the same run:

    alpha           accepted drafts / drafts tested                            (`measured_alpha`)
    tokens/round    measured, against E = (1 - alpha^(k+1)) / (1 - alpha)     (`expected_tokens_per_round`)
    cost model      speedup = (prefill + (n - 1) t_step) / (prefills + sum over rounds (k' t_draft + t_verify(k' + 1)))

with t_step, t_draft and t_verify(j) one target step, one draft step and a target forward over j positions, timed
alone, every one interleaved, at the mean context of the timed tokens (the prefills at the mean prompt length). What
the model calls leave out (sampling, verification, cache rollback, Python) is timed inside the loops themselves
(`Clocked`): per round of speculative decoding, per token of greedy decode.

The draft head's rounds cost `depth` head calls and one target forward over the tree's nodes (tree mask), so

    head model      speedup = tokens per round / (depth h + v)      h = t_head / t_step, v = t_verify(nodes) / t_step

with t_head one head call (one pair, its one-layer cache at the same context) and t_verify the target's forward over
each shape's nodes with its tree mask, timed interleaved with a target step (`head_costs`).

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
from minigpt.engine.draft_head import (DraftHead, head_cache, load_draft_head, target_features, tree_attention,
                                       with_attention)
from minigpt.engine.fused_decode import FusedModel, generate_fused
from minigpt.engine.head_speculative import TreeShape, chain_acceptance, generate_with_head
from minigpt.engine.speculative import ModelDrafter, generate_speculative, measured_alpha
from minigpt.engine.token_tree import tree_attention_inputs
from minigpt.model import GPT
from minigpt.costmodel.speculative_calculator import expected_tokens_per_round
from minigpt.timing import compare, fixed_threads

__all__ = ["CANDIDATES", "HEAD_SHAPES", "FusedLM", "Clocked", "settings", "natural_prompts", "step_costs",
           "cost_model", "shape_name", "head_candidate", "shape_parents", "head_costs", "head_model",
           "outside_model_calls", "compare_speculative", "measure_speculative", "figures", "notes"]

CANDIDATES = ("lab 01 generate_kv_cache", "fused decode step", "speculative, model as written", "speculative, fused",
              "transformers generate", "transformers assisted")
GOAL = 1.5
FORMS = {"model as written": ("speculative, model as written", "lab 01 generate_kv_cache"),
         "fused": ("speculative, fused", "fused decode step")}
HEAD_SHAPES = (TreeShape(2), TreeShape(4), TreeShape(3, 2, 2), TreeShape(4, 2, 2))   # the draft head's, against lab 01


def settings(quick: bool, threads: int = 1) -> dict[str, Any]:
    """8 prompts of 32-64 tokens, 64 new tokens each, 5 repeats (quick: 3 prompts, 32 new tokens, 3 repeats); the
    draft head's shapes as [depth, width, branch]."""
    return {"target": "target", "draft": "draft", "head": "draft-head", "prompts": 3 if quick else 8,
            "prompt_lens": [32, 64], "new_tokens": 32 if quick else 64, "k": 4,
            "head_shapes": [[s.depth, s.width, s.branch] for s in HEAD_SHAPES], "repeats": 3 if quick else 5,
            "threads": threads, "seed": 0}


def shape_name(shape: TreeShape) -> str:
    """"chain of 4" or "tree (3, 2, 2)" (depth, width, branch)."""
    if shape.width == shape.branch == 1:
        return f"chain of {shape.depth}"
    return f"tree ({shape.depth}, {shape.width}, {shape.branch})"


def head_candidate(shape: TreeShape) -> str:
    return f"draft head, {shape_name(shape)}"


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


def shape_parents(shape: TreeShape) -> list[int]:
    """The parents of a tree of `shape` (root -1), nodes level by level, the first `width` of a level expanded: as many
    nodes at each depth as `grow_tree` makes (it expands the likeliest), which is all a verification's cost depends
    on. (`TreeShape.nodes` counts `width` expanded nodes on the first level too, where there are only `branch`.)"""
    parents, level = [-1], [0]
    for _ in range(shape.depth):
        new = []
        for node in level[:shape.width]:
            for _ in range(shape.branch):
                parents.append(node)
                new.append(len(parents) - 1)
        level = new
    return parents


@torch.inference_mode()
def head_costs(target: GPT, head: DraftHead, context: Sequence[int], shapes: Sequence[TreeShape], *,
               repeats: int = 9, threads: int = 1) -> dict[str, Any]:
    """Median seconds of a target decode step (one token after `context`), one head call (one pair, its cache holding
    the context's pairs) and the target's forward over each shape's nodes with its tree mask (after `context`), as
    `generate_with_head` makes them; the caches reset to the context before every call, all timed in one interleaved
    `compare`."""
    n = len(context)
    sizes = sorted({len(shape_parents(shape)) for shape in shapes})
    cache = KVCache.for_model(target, max_seq_len=n + max(sizes) + 1)
    features, _ = target_features(target, torch.tensor([list(context)]), cache.next_positions(n), cache)
    hcache = head_cache(head, n + 1)
    head(features[:, :-1], torch.tensor([list(context[1:])]), target, 1 + torch.arange(n - 1), hcache)
    pair_f, pair_x = features[:, -1:], torch.tensor([[context[-1]]])

    def reset(c: KVCache, length: int) -> None:
        for layer in c:
            layer.length = length

    def step() -> None:
        reset(cache, n)
        target(pair_x, positions=cache.next_positions(1), kv_caches=cache)

    def head_call() -> None:
        reset(hcache, n - 1)
        head(pair_f, pair_x, target, torch.tensor([n]), hcache)

    calls = {"target step": step, "head call": head_call}
    for shape in shapes:
        parents = shape_parents(shape)
        mask, positions = tree_attention_inputs(parents, n)
        x = torch.tensor([list(context[-len(parents):])])

        def verify(mask=mask, positions=positions, x=x) -> None:
            reset(cache, n)
            with with_attention(target.layers, tree_attention(mask)):
                target_features(target, x, positions, cache)
        calls[f"verify {len(parents)}"] = verify
    t = compare(calls, warmup=2, repeats=repeats, threads=threads)
    target_bytes = sum(p.numel() * p.element_size() for p in target.parameters())     # a tied matrix counts once
    head_bytes = sum(p.numel() * p.element_size() for p in head.parameters()) + \
        target.lm_head.weight.numel() * target.lm_head.weight.element_size()
    return {"context": n, "target_step_s": t["target step"].median, "head_call_s": t["head call"].median,
            "verify_s": {str(j): t[f"verify {j}"].median for j in sizes}, "target_weight_bytes": target_bytes,
            "head_weight_bytes": head_bytes,
            "samples_s": {name: timing.samples for name, timing in t.items()}}


def head_model(generations: Sequence[Any], shape: TreeShape, costs: dict[str, Any]) -> dict[str, Any]:
    """A shape's rounds (tokens per round: mean emitted; for a chain the acceptance by position) and what its model
    calls alone predict: tokens per round / (depth h + v), h and v the head call and the verification in target
    steps."""
    rounds = [r for g in generations for r in g.rounds]
    per_round = sum(len(r.emitted) for r in rounds) / max(1, len(rounds))
    h = costs["head_call_s"] / costs["target_step_s"]
    nodes = len(shape_parents(shape))
    v = costs["verify_s"][str(nodes)] / costs["target_step_s"]
    found = {"shape": [shape.depth, shape.width, shape.branch], "nodes": nodes, "rounds": len(rounds),
             "tokens_per_round": per_round, "head_share": h, "verify_steps": v,
             "steps_per_round": shape.depth * h + v, "predicted_speedup": per_round / (shape.depth * h + v)}
    if shape.width == shape.branch == 1:
        found["acceptance_by_position"] = chain_acceptance(rounds, shape.depth)
    return found


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
                        repeats: int = 5, threads: int = 1, head: DraftHead | None = None,
                        shapes: Sequence[TreeShape] = HEAD_SHAPES) -> dict[str, Any]:
    """Time the six candidates over `prompts` (and, with a `head`, the head's for each of `shapes`); tokens/s, the
    rounds' alpha and tokens per round, the step costs and the cost model's prediction, for the model as written and
    fused (and the head's costs and model, "head"). Raises if any candidate's tokens differ."""
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
    for shape in shapes if head is not None else ():
        runs[head_candidate(shape)] = lambda shape=shape: [generate_with_head(target, head, p, new_tokens, shape=shape,
                                                                              **kw) for p in prompts]
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
    context = _context(prompts, prompt_len + new_tokens // 2)
    costs = step_costs(forms_models, context, prompt_len, k=k, repeats=2 * repeats + 1, threads=threads)
    forms = {}
    for form, (spec, _) in FORMS.items():
        forms[form] = {"step_costs": costs[form], **cost_model(outputs[spec], k, new_tokens, costs[form]),
                       "outside_model_calls": outside_model_calls(*forms_models[form], prompts, new_tokens=new_tokens,
                                                                  k=k, fused=form == "fused", threads=threads)}
    found = {"tokens_per_s": {name: n / t.median for name, t in timings.items()},
             "samples_s": {name: t.samples for name, t in timings.items()}, "tokens_identical": True,
             "forms": forms, "settings": {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                                          "new_tokens": new_tokens, "k": k, "repeats": repeats, "threads": threads,
                                          "step_cost_context": prompt_len + new_tokens // 2}}
    if head is not None:
        hc = head_costs(target, head, context, shapes, repeats=2 * repeats + 1, threads=threads)
        found["head"] = {"costs": hc, "shapes": {shape_name(shape): head_model(outputs[head_candidate(shape)], shape,
                                                                               hc) for shape in shapes}}
    return found


def measure_speculative(target: GPT, draft: GPT, *, quick: bool, threads: int = 1) -> dict[str, Any]:
    """`compare_speculative` on natural prompts, the stored draft head's shapes included; the ledger section."""
    s = settings(quick, threads)
    prompts = natural_prompts(s["prompts"], tuple(s["prompt_lens"]), seed=s["seed"])
    found = compare_speculative(target, draft, prompts, new_tokens=s["new_tokens"], k=s["k"], repeats=s["repeats"],
                                threads=threads, head=load_draft_head(s["head"]),
                                shapes=[TreeShape(*shape) for shape in s["head_shapes"]])
    found["settings"] = {**s, **found["settings"]}
    return found


def _context(prompts: Sequence[Sequence[int]], length: int) -> list[int]:
    """A natural context of `length` tokens: the prompts one after another."""
    joined = [t for p in prompts for t in p]
    return (joined * (length // max(1, len(joined)) + 1))[:length]


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows: each speculative form against its own greedy decode (goal), assisted against generate,
    speculative against assisted, and the measured acceptance; with the draft head, each of its shapes against lab
    01's greedy decode (goal), its tokens per round, and a head call and each tree's verification against a target
    step."""
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
    return rows + _head_figures(section) if "head" in section else rows


def _head_figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    tps, greedy = section["tokens_per_s"], "lab 01 generate_kv_cache"
    shapes, c = section["head"]["shapes"], section["head"]["costs"]
    rows = [figure(f"speculative decoding, draft head, {name} ({f['nodes']} nodes)",
                   tps[head_candidate(TreeShape(*f["shape"]))], "tok/s", against=greedy, baseline=tps[greedy],
                   goal=GOAL) for name, f in shapes.items()]
    rows += [figure(f"speculative decoding: tokens per round (draft head, {name})", f["tokens_per_round"], "tokens")
             for name, f in shapes.items()]
    step = f"target decode step (1 token after {c['context']})"
    rows.append(figure(f"draft head: one call (1 pair after {c['context'] - 1})", 1e3 * c["head_call_s"], "ms",
                       against=step, baseline=1e3 * c["target_step_s"], higher_is_better=False))
    for name, f in shapes.items():
        if name.startswith("tree"):
            rows.append(figure(f"target: verify the {f['nodes']}-node {name} (one forward, tree mask)",
                               1e3 * c["verify_s"][str(f["nodes"])], "ms", against=step,
                               baseline=1e3 * c["target_step_s"], higher_is_better=False))
    return rows


def notes(section: dict[str, Any]) -> list[str]:
    """Why speculation pays what it pays: alpha, tokens per round against the formula, step costs, the cost model."""
    s, k = section["settings"], section["settings"]["k"]
    lines = [f"speculative decoding: {s['prompts']} validation-corpus prompts of {min(s['prompt_tokens'])}-"
             f"{max(s['prompt_tokens'])} tokens, {s['new_tokens']} new tokens each, greedy, all "
             f"{len(section['tokens_per_s'])} candidates the same tokens."]
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
    return lines + _head_notes(section) if "head" in section else lines


def _head_notes(section: dict[str, Any]) -> list[str]:
    """The head's and the verifications' costs, each shape's rounds and what its model calls predict, and the goal:
    met, or why not, from the same numbers."""
    shapes, c = section["head"]["shapes"], section["head"]["costs"]
    h = c["head_call_s"] / c["target_step_s"]
    verify = ", ".join(f"{j} nodes {1e3 * t:.2f} ms ({t / c['target_step_s']:.2f} steps)"
                       for j, t in c["verify_s"].items())
    lines = [f"draft head (`{section['settings'].get('head', 'draft-head')}`, `generate_with_head`, greedy, the same "
             f"prompts): one head call (one pair, {c['context'] - 1} in its cache) takes {1e3 * c['head_call_s']:.2f} "
             f"ms, h = {h:.2f} of a target decode step ({1e3 * c['target_step_s']:.2f} ms after {c['context']}); it "
             f"reads {c['head_weight_bytes'] / c['target_weight_bytes']:.0%} of the target's weight bytes (its layer "
             f"and input projection with the shared LM head, {c['head_weight_bytes'] / 1e6:.1f} MB against "
             f"{c['target_weight_bytes'] / 1e6:.1f} MB). The target's forward over a tree's nodes (tree mask): "
             f"{verify}."]
    greedy = section["tokens_per_s"]["lab 01 generate_kv_cache"]
    measured = {name: section["tokens_per_s"][head_candidate(TreeShape(*f["shape"]))] / greedy
                for name, f in shapes.items()}
    for name, f in shapes.items():
        depth = f["shape"][0]
        chain = ("; acceptance by position " + "/".join(f"{a:.2f}" for a in f["acceptance_by_position"])
                 if "acceptance_by_position" in f else "")
        lines.append(f"draft head, {name} ({f['nodes']} nodes): {f['tokens_per_round']:.2f} tokens per round over "
                     f"{f['rounds']} rounds{chain}; a round costs {depth} x {f['head_share']:.2f} + "
                     f"{f['verify_steps']:.2f} = {f['steps_per_round']:.2f} target steps in model calls, so these "
                     f"alone predict {f['tokens_per_round']:.2f} / {f['steps_per_round']:.2f} = "
                     f"{f['predicted_speedup']:.2f}x, measured {measured[name]:.2f}x.")
    best = max(measured, key=measured.get)
    if measured[best] >= GOAL:
        lines.append(f"draft head against the goal of {GOAL:g}x: met by the {best} ({measured[best]:.2f}x).")
        return lines
    v = sorted((f["nodes"], f["verify_steps"]) for f in shapes.values())
    needs = ", ".join(f"{GOAL * f['steps_per_round']:.2f} for the {name} (at most {f['shape'][0] + 1}) against "
                      f"{f['tokens_per_round']:.2f} measured" for name, f in shapes.items())
    lines.append(f"draft head against the goal of {GOAL:g}x: not met; the best, the {best}, gives "
                 f"{measured[best]:.2f}x (its model calls predict {shapes[best]['predicted_speedup']:.2f}x). A round of depth d costs "
                 f"d h + v target steps in model calls (h = {h:.2f} a head call, v = {v[0][1]:.2f} to {v[-1][1]:.2f} "
                 f"steps for {v[0][0]} to {v[-1][0]} nodes), so {GOAL:g}x needs {GOAL:g} (d h + v) tokens a round: "
                 f"{needs}.")
    return lines
