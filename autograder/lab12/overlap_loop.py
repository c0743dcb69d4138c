"""Exercise 2: the overlapped engine loop, run on the judge's engine through an OverlapDriver.

The learner's loop gets the judge's driver (judged: a handle; every operation a request the judge answers) and
calls its five operations; the driver does the work on the judge's engine and records their order itself. The
verdict is the judge's: every request's tokens equal those of the judge's serial engine on the same workload, nothing
is left running, and every step that landed ran beside the scheduling of the next one (a `schedule` call between its
launch and its landing: what a serial loop never does). Both engines are batch-invariant, so the tokens cannot
depend on which steps the overlap makes differ.
"""

from __future__ import annotations

from typing import Callable

import torch

from autograder.checking.reference_guard import own_work, watched
from autograder.harness import call_learner
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.overlap_driver import OverlapDriver, run_overlapped
from minigpt.tokenizer import EOT_ID

EX2 = "Exercise 2 (run_overlapped)"
REFERENCES = (run_overlapped,)
CONFIG = ModelConfig(vocab_size=EOT_ID + 1, max_seq_len=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
STOP_BIAS = ((EOT_ID, 6.0),)          # the end-of-text token drawn every 15 steps or so at temperature 1


def _model() -> GPT:
    with torch.random.fork_rng():
        torch.manual_seed(12)
        return GPT(CONFIG).eval()


def _workload(seed: int) -> list[tuple[list[int], int, SamplingParams]]:
    """Drawn requests: 1-30 prompt tokens, 1-20 output tokens, greedy, seeded, or seeded with stops likely; more
    than run at once, so that requests are admitted as others finish."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(7):
        prompt = torch.randint(0, 4000, (int(torch.randint(1, 31, (1,), generator=g)),), generator=g).tolist()
        budget = int(torch.randint(1, 21, (1,), generator=g))
        sampling = (SamplingParams() if i % 3 == 0 else SamplingParams(temperature=1.0, seed=seed + i) if i % 3 == 1
                    else SamplingParams(temperature=1.0, seed=seed + i, logit_bias=STOP_BIAS))
        out.append((prompt, budget, sampling))
    return out


def _engine(model: GPT, overlapped: bool) -> LLMEngine:
    return LLMEngine(model, EngineConfig(num_blocks=24, block_size=8, max_num_seqs=3, max_num_batched_tokens=24,
                                         enable_prefix_caching=True, batch_invariant=True,
                                         async_scheduling=overlapped))


def _serial_tokens(model: GPT, workload: list) -> dict:
    engine = _engine(model, False)
    for i, (prompt, budget, sampling) in enumerate(workload):
        engine.add_request(f"r{i}", prompt, max_tokens=budget, sampling=sampling)
    tokens: dict = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def check_overlapped_loop(fn: Callable) -> None:
    """fn(driver) runs the driver's engine to the end, overlapped: the serial engine's tokens on two drawn workloads,
    nothing left running, every landed step overlapped with the scheduling of the next."""
    own_work(fn, REFERENCES, what=EX2)
    fn = watched(fn, REFERENCES, EX2)
    model = _model()
    for seed in (5, 9):
        workload = _workload(seed)
        want = _serial_tokens(model, workload)
        engine = _engine(model, True)
        try:
            for i, (prompt, budget, sampling) in enumerate(workload):
                engine.add_request(f"r{i}", prompt, max_tokens=budget, sampling=sampling)
            driver = OverlapDriver(engine)
            what = f"{EX2}, workload {seed} (7 requests, at most 3 at once)"
            call_learner(EX2, fn, driver, context=what)
            if driver.has_unfinished():
                raise AssertionError(f"{what}: your loop returned with requests unfinished or a step in flight: loop "
                                     "while driver.has_unfinished()")
            got = {rid: driver.tokens.get(rid, []) for rid in want}
            wrong = [rid for rid in want if got[rid] != want[rid]]
            if wrong:
                raise AssertionError(f"{what}: requests {wrong} got other tokens than the serial engine "
                                     f"({got[wrong[0]][:8]} against {want[wrong[0]][:8]})")
            landed, overlapped = driver.landed_steps(), driver.overlapped_steps()
            if overlapped < landed:
                raise AssertionError(f"{what}: only {overlapped} of the {landed} steps ran beside the scheduling of "
                                     "the next one: schedule step N+1 after launching step N and before landing it "
                                     "(a loop that schedules after landing is the serial loop)")
        finally:
            engine.close()
