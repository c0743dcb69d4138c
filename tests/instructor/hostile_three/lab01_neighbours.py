"""Lab 01's speed check, passed by a slow generator with helpers that busy the cores while the judge times.

The answer is a correct cached generator made slow on purpose (three 700 x 700 matrix products wasted at every step,
about what the naive loop adds: alone it reaches about a seventh of the reference's speedup, below the 0.41
the check needs). Its cell also starts eight processes that spin whenever a timing session is on (a flag file
the generator touches) and the generator itself is not running: they take the cores from the judge while it
times its own baseline and reference, which slows the reference's speedup and lifts the learner's ratio above
the threshold. Before issue 55 that earned the check's points. Now the judge asks the grading process to stop
every process of the submission (SIGSTOP, from outside the sandbox) while it times its own calls, and all but
the serving process while it times the learner's, counting that call at the larger of its wall time and the CPU
time the submission used meanwhile (autograder/checking/isolation.py): the helpers never run beside a timed call,
and the ratio stays the slow generator's.
"""

KIND = "timing a neighbour bends (lab 01: helpers busy while the judge times)"
SETUP = '''\
import torch
from minigpt.cache.contiguous import LayerKVCache
from minigpt.generate import Generation, StopRule, check_request
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID
torch.set_num_threads(1)
'''
_LOOP = '''\
@torch.inference_mode()
def generate_kv_cache(model, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                      stop_token_ids=(EOT_ID,), stop_strings=(), tokenizer=None) -> Generation:
    {enter}
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
        {waste}
        token = int(sample_next(logits, sampling, generator))
        reason = stop.add(token)
        tokens = torch.tensor([[token]], device=model.device)
    {leave}
    return Generation(stop.tokens, reason, prompt_tokens=len(ids))
'''
SOLUTION = _LOOP.format(enter="", waste="", leave="")
CHECK = ('from autograder.lab01 import check_cached_speedup\n'
         'result = check_cached_speedup(generate_kv_cache)\n')
POINTS = 2
ATTACK = '''\
import os, subprocess, sys, time
_FLAG, _SESSION = "/tmp/learner-busy", "/tmp/timing-session"
_HOG = """
import os, time
while True:
    try:
        recent = time.time() - os.path.getmtime('/tmp/timing-session') < 5
    except OSError:
        recent = False
    if recent and not os.path.exists('/tmp/learner-busy'):
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(0.002)
"""
_W = torch.randn(700, 700)
_hogs = [subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) for _ in range(8)]
''' + _LOOP.format(
    enter='open(_FLAG, "w").close(); open(_SESSION, "w").close()',
    waste="[_W @ _W for _ in range(3)]          # slow on purpose: about a naive step's work, not the model's",
    leave='os.remove(_FLAG); open(_SESSION, "w").close()')
