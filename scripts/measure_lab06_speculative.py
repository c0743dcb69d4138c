"""Lab 06 measurements outside the notebook (bigger sweep): acceptance, tokens per round against the formula,
wall-clock speedup of speculative decoding over lab 01's cached generation for k = 1..8 with the draft model
and with prompt lookup, the cost model's predictions, and the distribution tests' statistics.

    .venv/bin/python scripts/measure_lab06_speculative.py [--new-tokens 48] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse

import torch

from autograder.lab06 import (ENGINE_SAMPLES, SIGNIFICANCE, VERIFY_SAMPLES, code_edit_prompts, engine_distribution_test,
                              verify_distribution_test)
from minigpt.cache.contiguous import KVCache
from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.ngram_draft import PromptLookupDrafter
from minigpt.engine.speculative import generate_speculative, measured_alpha, verify_draft
from minigpt.costmodel.speculative_calculator import expected_tokens_per_round
from minigpt.timing import compare
from minigpt.training.data import load_tokens


@torch.inference_mode()
def step_costs(target, draft, context: list[int], threads: int, repeats: int) -> dict:
    caches = {}
    for name, m in (("target", target), ("draft", draft)):
        cache = KVCache.for_model(m, max_seq_len=len(context) + 16)
        m(torch.tensor([context]), positions=cache.next_positions(len(context)), kv_caches=cache)
        caches[name] = cache

    def run(m, cache, n):
        x = torch.tensor([context[-n:]])

        def call():
            for layer in cache:
                layer.length = len(context)
            m(x, positions=cache.next_positions(n), kv_caches=cache)
        return call
    fns = {f"verify{k}": run(target, caches["target"], k + 1) for k in range(9)}
    fns["draft"] = run(draft, caches["draft"], 1)
    r = compare(fns, warmup=2, repeats=repeats, threads=threads)
    return {"step": r["verify0"].median, "verify": {k: r[f"verify{k}"].median for k in range(9)}, "draft": r["draft"].median}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = load_model("target"), load_model("draft")
    costs = step_costs(target, draft, load_tokens("val")[:96].tolist(), args.threads, args.repeats)
    print(f"target step {costs['step'] * 1e3:.2f} ms; draft step {costs['draft'] * 1e3:.2f} ms "
          f"({costs['draft'] / costs['step']:.2f} steps); verify: " +
          ", ".join(f"{k + 1} pos {v * 1e3:.2f} ms" for k, v in costs["verify"].items()))
    for name, n, results in (("verify_draft", VERIFY_SAMPLES, verify_distribution_test(verify_draft)),
                             ("generate_speculative", ENGINE_SAMPLES, engine_distribution_test(generate_speculative))):
        print(f"distribution tests (significance {SIGNIFICANCE}), {name} n={n}: " + "; ".join(
            f"{what} chi2 {r.statistic:.1f}/dof {r.dof} (p {r.p_value:.3g})"
            for what, r in zip(("first token", "first two", "second and third"), results)))
    val = load_tokens("val")
    rounds = []
    for i in range(12):
        pr = val[i * 9001:i * 9001 + 32].tolist()
        g = generate_speculative(target, draft, pr, 32, k=4, stop_token_ids=())
        assert g.tokens == generate_kv_cache(target, pr, 32, stop_token_ids=()).tokens
        rounds += g.rounds
    a = measured_alpha(rounds)
    full = [r for r in rounds if len(r.drafted) == 4]
    print(f"validation text, draft model, k=4: alpha {a:.3f}, tokens/round {sum(len(r.emitted) for r in full) / len(full):.2f} "
          f"vs formula {expected_tokens_per_round(a, 4):.2f} (12 prompts, greedy equal to the target on all)")
    lookup = PromptLookupDrafter(target.config.vocab_size)
    kw = {"stop_token_ids": ()}
    for pi, prompt in enumerate(code_edit_prompts()):
        for k in range(1, 9):
            last = {}

            def timed(name, fn):
                def call():
                    last[name] = fn()
                return call
            r = compare({"cached": timed("cached", lambda: generate_kv_cache(target, prompt, args.new_tokens, **kw)),
                         "draft": timed("draft", lambda: generate_speculative(target, draft, prompt, args.new_tokens, k=k, **kw)),
                         "lookup": timed("lookup", lambda: generate_speculative(target, lookup, prompt, args.new_tokens, k=k, **kw))},
                        warmup=1, repeats=args.repeats, threads=args.threads)
            parts = []
            for name, t_d in (("draft", costs["draft"]), ("lookup", 0.0)):
                g = last[name]
                assert g.tokens == last["cached"].tokens
                cost = sum(len(x.drafted) * t_d + costs["verify"][len(x.drafted)] for x in g.rounds)
                parts.append(f"{name}: alpha {measured_alpha(g.rounds):.2f}, {g.tokens_per_round:.2f} tok/round, "
                             f"{r['cached'].median / r[name].median:.2f}x measured, "
                             f"{len(g.tokens) * costs['step'] / cost:.2f}x predicted")
            print(f"code prompt {pi}, k={k}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
