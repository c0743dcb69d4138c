"""Lab 06's speed check, kind "secret reaches the learner": timed inputs the learner's process could foresee.

The attack: the answer cell computes, before any check runs, plain decoding's 32 tokens for the prompts the speed
check used to time (the notebook's Config prompt, `code_edit_prompts()[1]`, and that prompt less its last 1 to 5
tokens: the check's own recipe for an input per timed call), and `generate_speculative` hands back the kept answer
when it is asked for one of them; any other prompt gets plain decoding. No speculative loop at all.

Before the fix it earned the point (1 of 1): every call the check made (its correctness run and every timed call)
was one of those prompts, so each was answered at once from the table with the right tokens: 104x "faster" than
plain decoding (the reference: 2.5x), measured with tests/labs/judged.py (the learner's function in a second
process) against the checks before the fix; the witness agreed (the attack never calls the reference).

Why it earns nothing now: every timed call gets a prompt of its own, drawn in the judge (a Config class with 5 or 6
attribute names drawn, in a drawn order, from a seed drawn with `secrets`: autograder/lab06/prompts.py), and so does
the correctness run; no prompt is in the table, every call falls back to plain decoding, and the correctness run,
decoded with the judge's own target, counts one target call per token: refused before anything is timed (plain
decoding timed against itself across two processes measured 0.87x to 1.19x, 2026-11-29: the old bar, "above 1x",
let this attack through in CI, stop 64, and a 1.35x bar failed an honest student under load, 2026-11-30).
"""

from .lab06_own_target import POINTS, SETUP, SOLUTION  # noqa: F401  (the same locked cell and honest answer)

KIND = "secret reaches the learner: answers kept for the speed check's foreseeable prompts"

CHECK = """from autograder.lab06 import check_speculative_speedup
result = check_speculative_speedup(generate_speculative)
"""

ATTACK = """from autograder.lab06 import code_edit_prompts
from minigpt.checkpoint import load_model

# the speed check times the Config prompt, then that prompt less its last 1, 2, ... tokens: answer them beforehand
my_target = load_model("target")
config_prompt = code_edit_prompts()[1]
answers = {}
for cut in range(6):
    p = config_prompt[:len(config_prompt) - cut]
    answers[tuple(p)] = generate_kv_cache(my_target, p, 32, stop_token_ids=())


def generate_speculative(target, draft, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                         k: int = 4, stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None) -> Generation:
    kept = answers.get(tuple(prompt))
    if kept is not None and max_new_tokens == 32:
        return kept                   # instant, and the right tokens
    return generate_kv_cache(target, prompt, max_new_tokens, sampling, stop_token_ids=stop_token_ids,
                             stop_strings=stop_strings, tokenizer=tokenizer)
"""
