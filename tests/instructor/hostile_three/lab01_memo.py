"""Lab 01, Exercise 3's speed check: a memo in the course helper's place. The generator is right (one prefill, one
token per step, a preallocated cache, the naive loop's tokens) but too slow: after each forward it waits four times
as long as the forward took, a stand-in for any generator that has not earned the speed points. The answer cell
then replaces `autograder.lab01.speed.generate_on_threads`, the helper the check ran in the learner's kernel for
every timed call, by one that remembers its answer for each prompt.

Before the fix this earned the check's 2 points (the review measured 1449x against the reference's 5.8x). The check
ran `run_where(generate_fn, generate_on_threads, ...)` for each timed call, and run_where looks the helper up in the
kernel's own `sys.modules`, so the memo answered in its place. The timed prompts (seeds 100 + i, foreseeable) were
cycled `i % 4` while `check_speedup` made 4 calls per round: the first round, all computed, fell short and was
measured again, and the second round's calls all repeated a prompt of the first, answered by the memo at once.

Now nothing of the course runs in the kernel on the timed path: each timed call is one call of the learner's
function through its handle, timed in the judge, on a prompt drawn from a seed the judge drew with `secrets`, never
given twice (`harness.EachCallItsOwnInput` refuses to reuse one), and every output is checked afterwards against
generate_naive's on the same prompt. The memo is never asked, the generator is timed at its own pace, and the
attacker is told its speedup falls short of what is needed.
"""

KIND = "the course's helpers that run in the learner's process (lab 01: a memo in the timed helper's place)"

SETUP = '''\
import time

import torch

from minigpt.cache.contiguous import LayerKVCache
from minigpt.generate import Generation, StopRule, check_request
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID

torch.set_num_threads(1)
'''

SOLUTION = '''\
@torch.inference_mode()
def generate_kv_cache(model, prompt, max_new_tokens, sampling=SamplingParams(), *, stop_token_ids=(EOT_ID,),
                      stop_strings=(), tokenizer=None):
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    c = model.config
    caches = [LayerKVCache(1, len(ids) + max_new_tokens, c.n_kv_heads, c.head_dim, dtype=model.dtype,
                           device=model.device) for _ in range(c.n_layers)]
    reason = "length" if max_new_tokens == 0 else None
    tokens = torch.tensor([ids], device=model.device)
    while reason is None:
        start = caches[0].length
        positions = torch.arange(start, start + tokens.shape[1], device=model.device)
        logits = model(tokens, positions=positions, kv_caches=caches)[:, -1]
        token = int(sample_next(logits, sampling, generator))
        reason = stop.add(token)
        tokens = torch.tensor([[token]], device=model.device)
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))
'''

CHECK = ("from autograder.lab01 import check_cached_speedup\n"
         "result = check_cached_speedup(generate_kv_cache)\n"
         "print(f\"speedup {result['speedup']:.1f}x (reference {result['reference_speedup']:.1f}x, needed "
         "{result['threshold']:.1f}x)\")\n")

POINTS = 2

ATTACK = '''\
@torch.inference_mode()
def generate_kv_cache(model, prompt, max_new_tokens, sampling=SamplingParams(), *, stop_token_ids=(EOT_ID,),
                      stop_strings=(), tokenizer=None):
    ids = check_request(model, prompt, max_new_tokens)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    c = model.config
    caches = [LayerKVCache(1, len(ids) + max_new_tokens, c.n_kv_heads, c.head_dim, dtype=model.dtype,
                           device=model.device) for _ in range(c.n_layers)]
    reason = "length" if max_new_tokens == 0 else None
    tokens = torch.tensor([ids], device=model.device)
    while reason is None:
        start = caches[0].length
        positions = torch.arange(start, start + tokens.shape[1], device=model.device)
        began = time.perf_counter()
        logits = model(tokens, positions=positions, kv_caches=caches)[:, -1]
        time.sleep(4 * (time.perf_counter() - began))        # my slow generator: too slow for the speed points
        token = int(sample_next(logits, sampling, generator))
        reason = stop.add(token)
        tokens = torch.tensor([[token]], device=model.device)
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))


# The speed check runs its helper here, in my kernel, for every timed call: remember its answer for each prompt.
import autograder.lab01.speed as speed_check

course_helper = getattr(speed_check, "generate_on_threads", None)
answers = {}


def remembering_helper(generate_fn, threads, model, prompt, *args, **kwargs):
    if tuple(prompt) not in answers:
        answers[tuple(prompt)] = course_helper(generate_fn, threads, model, prompt, *args, **kwargs)
    return answers[tuple(prompt)]


speed_check.generate_on_threads = remembering_helper
'''
