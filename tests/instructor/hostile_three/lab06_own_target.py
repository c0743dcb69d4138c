"""Lab 06's target-calls check, kind "count on the judge's target": a generator that decodes on its own copy of the
course's trained target.

The attack: `generate_speculative` loads the trained target in the learner's process (`load_model("target")`, the file
every notebook can read) and runs plain decoding on it, never calling the `target` it is handed. No speculative loop
at all.

Before the fix it earned the point (1 of 1): `check_target_calls` compared the greedy tokens on the kernel's own copy
of the models and then counted the forwards of the judge's target during a second run, whose output it did not check.
The copy gave the right tokens, the judge counted 0 target calls (below plain decoding's 32, at most the reference's
+ 1) and 0 positions fed to the draft model (at most twice the reference's); the witness agreed (the attack never calls
the reference). Measured with tests/labs/judged.py (the learner's function in a second process) against the checks
before the fix: passed, 0.0 target calls per token with prompt lookup and with the draft model.

Why it earns nothing now: the target the check hands over is the trained one with every weight moved by a secret
noise drawn in the judge (autograder/lab06/judge_target.py), with a prompt drawn there too, until that target's greedy
continuation differs from the public target's; the counted run's tokens must be that continuation, so a copy gives
the wrong tokens ("differs from the greedy output of the target it was handed"). Were the tokens right anyway, a count
below ceil(32 / (k + 1)) calls (what k drafts and a bonus token a call allow) fails as well.
"""

KIND = "count on the judge's target: decode on an own copy of the course's trained target"

SETUP = """import torch
from minigpt.cache.contiguous import KVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.generate import Generation, StopRule, check_request
from minigpt.sampling import SamplingParams, make_generator
from minigpt.tokenizer import EOT_ID

torch.set_num_threads(1)
"""

# the solution notebook's exercise 4 (its check binds truncate_cache, sampling_probs and verify_draft to the package's)
SOLUTION = """@torch.inference_mode()
def generate_speculative(target, draft, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                         k: int = 4, stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None) -> Generation:
    '''Draft k tokens with `draft`, verify them with `target` in one forward; same output distribution as target.'''
    ids = check_request(target, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, target.device)
    size = len(ids) + max_new_tokens
    t_cache, d_cache = KVCache.for_model(target, 1, size), KVCache.for_model(draft, 1, size)
    context = list(ids)
    reason = "length" if max_new_tokens == 0 else None
    while reason is None:
        k_round = min(k, max_new_tokens - len(stop.tokens) - 1)
        drafted, q_rows = [], []
        x = context[d_cache.length:]
        for _ in range(k_round):
            logits = draft(torch.tensor([x]), positions=d_cache.next_positions(len(x)), kv_caches=d_cache)[0, -1]
            q = sampling_probs(logits, sampling)
            t = int(q.argmax()) if sampling.greedy else int(torch.multinomial(q, 1, generator=generator))
            drafted.append(t)
            q_rows.append(q)
            x = [t]
        feed = context[t_cache.length:] + drafted
        logits = target(torch.tensor([feed]), positions=t_cache.next_positions(len(feed)), kv_caches=t_cache)
        p = sampling_probs(logits[0, -(k_round + 1):], sampling)
        q = torch.stack(q_rows) if q_rows else p.new_zeros(0, p.shape[-1])
        emitted, _ = verify_draft(drafted, q, p, generator)
        n, L = len(emitted) - 1, len(context)
        truncate_cache(t_cache, L + n)
        truncate_cache(d_cache, min(d_cache.length, L + n))
        for t in emitted:
            reason = stop.add(t)
            context.append(t)
            if reason is not None:
                break
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))
"""

CHECK = """from autograder.lab06 import check_target_calls
calls = check_target_calls(generate_speculative)
"""

POINTS = 1

ATTACK = """from minigpt.checkpoint import load_model

my_target = load_model("target")      # my own copy of the course's target: the grader never sees its calls


@torch.inference_mode()
def generate_speculative(target, draft, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                         k: int = 4, stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None) -> Generation:
    '''Plain decoding on my copy of the target: the target handed in is never called, so it counts no calls.'''
    return generate_kv_cache(my_target, prompt, max_new_tokens, sampling, stop_token_ids=stop_token_ids,
                             stop_strings=stop_strings, tokenizer=tokenizer)
"""
