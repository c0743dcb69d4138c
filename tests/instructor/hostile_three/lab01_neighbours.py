"""Lab 01's speed check, passed by a slow generator with helpers that busy the cores while the judge times.

The answer is a correct cached generator made slow on purpose: at every step it also runs the naive loop's forward
pass over the whole sequence (on a model of its own of the same shape: the check records the calls of the one it
hands over), so alone it is slower than generate_naive: 0.81x where the reference reached 4.50x and the check asked
41% of that, 1.84x (2026-11-29, the course's 2-core machine). An earlier version wasted three 700 x 700 products
instead, which reached 1.77x against 2.04x needed there: one noisy round from passing with no help at all (it did
in CI, stop 64), which is not the attack. Its cell also starts eight processes that spin whenever a timing session
is on (a flag file the generator touches) and the generator itself is not running: they take the cores from the
judge while it times its own baseline and reference, which slows the baseline and lifts the learner's speedup
above the threshold: run where nothing holds the submission (the check in one process, as in JupyterLab), it
passed at 2.17x against 1.19x needed. Before issue 55 that earned the check's points. Now the judge asks the grading process to
stop every process of the submission (SIGSTOP, from outside the sandbox) while it times its own calls, and all but
the serving process while it times the learner's, counting that call at the larger of its wall time and the CPU
time the submission used meanwhile (autograder/checking/isolation.py): the helpers never run beside a timed call,
and the ratio stays the slow generator's.
"""

KIND = "timing a neighbour bends (lab 01: helpers busy while the judge times)"
# the honest answer, its setup and check are lab01_memo's: the two attackers share one assignment and its honest student
from hostile_three.lab01_memo import CHECK, POINTS, SETUP, SOLUTION  # noqa: E402,F401

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
ATTACK = '''\
import os, subprocess, sys, time
from minigpt.model import GPT
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
_twins = {}


def _twin(model):
    """A model of the same shape, not the one the check hands over (whose calls it records)."""
    key = repr(model.config)
    if key not in _twins:
        _twins[key] = GPT(model.config).eval()
    return _twins[key]


_hogs = [subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) for _ in range(8)]
''' + _LOOP.format(
    enter='open(_FLAG, "w").close(); open(_SESSION, "w").close()',
    waste="_twin(model)(torch.tensor([ids + list(stop.tokens)]))   # a naive step's work besides, on a twin",
    leave='os.remove(_FLAG); open(_SESSION, "w").close()')
