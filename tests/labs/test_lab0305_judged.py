"""Labs 03 and 05 judged: a test cell run by a real judge process (autograder/judging/judge.py) against this process, which
plays the learner's kernel (autograder/judging/observe.py's side of the wire), with the solution notebook's answers.

Guards what made these checks slow or broken once their answers arrived as Remotes: lab 03's scheduler check asked
~116,000 questions over the wire (every attribute of every step), lab 05's fold_awq_scales deep-copied a judge's
model, and its Triton launches were counted in the judge, where no kernel runs. And lab 03's scheduler is judged
from the judge's side: the judge calls it step by step, no lab 03 function runs in the kernel, and steps forged
there earn nothing (tests/instructor/hostile_three/lab03_steps.py). About 70 s on a busy 2-core CPU.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import secrets
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from autograder.judging import judge
from autograder.checking import wire
from autograder.judging.observe import observed_call
from tests.labs.notebook_solutions import solution_cells
from tests.labs.test_lab03_checks import SOLUTION as LAB03
from tests.labs.test_lab03_checks import Solution as Lab03Scheduler
from tests.labs.test_lab05_checks import SOLUTION as LAB05


class CountingEndpoint(wire.Endpoint):
    """The kernel's endpoint, counting the judge's requests it answers and noting the course functions it is asked
    to run here."""

    answered = 0

    def _answer(self, header: dict, blob: dict) -> None:
        self.answered += 1
        if header.get("op") == "package":
            self.ran_here.append(str(header.get("path")))
        super()._answer(header, blob)

    @property
    def ran_here(self) -> list[str]:
        return self.__dict__.setdefault("_ran_here", [])


@pytest.fixture(scope="module")
def judge_process():
    folder = tempfile.mkdtemp(prefix="judge-")
    process = judge.JudgeProcess(folder)
    yield process
    process.close()
    shutil.rmtree(folder, ignore_errors=True)          # tests leave nothing behind


def judged(process: judge.JudgeProcess, source: str, names: dict[str, Any], *,
           kernel: list[CountingEndpoint] | None = None) -> tuple[dict, int]:
    """Run the test cell `source` in the judge, answering from `names`; (its result, requests answered here).
    `kernel`: a list the kernel's endpoint is appended to (what it was asked to run here)."""
    token = secrets.token_hex(8)
    process.run(source, token, 30)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(process.path)
    with sock:
        endpoint = CountingEndpoint(sock, names=names, on_call=observed_call)
        if kernel is not None:
            kernel.append(endpoint)
        endpoint.hello(token)
        endpoint.serve()
    return process.result(60), endpoint.answered


class CountedScheduler(Lab03Scheduler):
    """The notebook's scheduler, counting the judge's calls into it."""

    calls: collections.Counter = collections.Counter()

    def __init__(self, *args, **kwargs):
        CountedScheduler.calls["built"] += 1
        super().__init__(*args, **kwargs)

    def add_request(self, request):
        CountedScheduler.calls["add_request"] += 1
        return super().add_request(request)

    def schedule(self):
        CountedScheduler.calls["schedule"] += 1
        return super().schedule()


def test_lab03_scheduler_check_judged_step_by_step(judge_process):
    """The judge calls schedule() and update() one request each (add_request one per request, 5 per scheduler
    built: its manager, itself, its three methods; and a few for the bad-input case, the name and the refusal), and
    asks the kernel to run no function of lab 03: only the scheduler's own BlockManager is built there and the
    refusal of the reference looks at the class there."""
    CountedScheduler.calls.clear()
    kernel: list[CountingEndpoint] = []
    result, requests = judged(judge_process, "from autograder.lab03 import check_scheduler\n"
                                             "check_scheduler(MyScheduler, max_examples=8)\n",
                              {"MyScheduler": CountedScheduler}, kernel=kernel)
    assert result["error"] is None, result["error"]
    calls = CountedScheduler.calls
    assert requests <= 2 * calls["schedule"] + calls["add_request"] + 5 * calls["built"] + 10, (requests, calls)
    assert set(kernel[0].ran_here) == {"minigpt.cache.block_manager:BlockManager",
                                       "autograder.checking.reference_guard:own_work"}, kernel[0].ran_here


@contextlib.contextmanager
def cells_run_here(*sources: str) -> Iterator[dict[str, Any]]:
    """Notebook cells run in this process (the kernel's side), as a kernel runs them; what they change in the course's
    lab 03 modules is undone afterwards (the judge's process is another one: it never sees those changes)."""
    modules = [m for name, m in sorted(sys.modules.items()) if name.startswith("autograder.lab03")]
    saved = [dict(vars(m)) for m in modules]
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        for i, source in enumerate(sources):
            exec(compile(source, f"<cell {i}>", "exec"), namespace)
        yield namespace
    finally:
        for module, before in zip(modules, saved):
            for name in set(vars(module)) - set(before):
                delattr(module, name)
            for name, value in before.items():
                setattr(module, name, value)


def _hostile(stem: str) -> Any:
    path = Path(__file__).resolve().parents[1] / "instructor" / "hostile_three" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"hostile_three_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("answer, earns", [("SOLUTION", True), ("ATTACK", False)])
def test_lab03_steps_forged_in_the_kernel_earn_nothing(judge_process, answer, earns):
    """The hostile class's forged-steps attack, at the check's level: the honest scheduler passes, the one whose steps
    and outputs the kernel forged (lab 03's course functions replaced there) fails at its first schedule()."""
    kind = _hostile("lab03_steps")
    with cells_run_here(kind.SETUP, getattr(kind, answer)) as cells:
        result, _ = judged(judge_process, kind.CHECK, {"MyScheduler": cells["MyScheduler"],
                                                       "pack_chunks": cells["pack_chunks"]})
    if earns:
        assert result["error"] is None, result["error"]
    else:
        assert result["error"] and "not implemented" in result["error"]["evalue"], result["error"]


def test_lab03_model_checks_judged(judge_process):
    result, _ = judged(judge_process, "from autograder.lab03 import check_static_batching\n"
                                      "check_static_batching(static_generate)\n",
                       {"static_generate": LAB03["static_generate"]})
    assert result["error"] is None, result["error"]


def test_lab03_judged_scheduler_check_still_refuses_the_reference(judge_process):
    from minigpt.engine.scheduler import Scheduler

    class CallsSuper(Scheduler):
        def schedule(self):
            return super().schedule()

    result, _ = judged(judge_process, "from autograder.lab03 import check_scheduler\n"
                                      "check_scheduler(MyScheduler, max_examples=2)\n", {"MyScheduler": CallsSuper})
    assert result["error"] and "reference" in result["error"]["evalue"], result["error"]


def test_lab05_awq_fold_and_triton_gemv_judged(judge_process):
    result, _ = judged(judge_process, "from autograder.lab05 import check_awq_fold, check_dequant_gemv\n"
                                      "check_awq_fold(fold_awq_scales)\n"
                                      "check_dequant_gemv(triton_dequant_gemv)\n",
                       {"fold_awq_scales": LAB05["fold_awq_scales"],
                        "triton_dequant_gemv": LAB05["triton_dequant_gemv"]})
    assert result["error"] is None, result["error"]


def test_lab05_int4_speed_judged_calls_the_learners_linear_from_the_judge(judge_process):
    """The timed calls are the judge's own requests, on inputs it drew: 1 (the small case's linear) + 1 (its output)
    + 1 (the timed linear) + one request per timed sample (warm-up + repeats), each making 4 calls in the kernel."""
    result, answered = judged(judge_process, "from autograder.lab05 import check_int4_cpu_linear\n"
                                             "check_int4_cpu_linear(make_int4_linear, repeats=2)\n",
                              {"make_int4_linear": LAB05["make_int4_linear"]})
    assert result["error"] is None, result["error"]
    assert answered >= 3 + (1 + 2)


def test_lab05_kv_cache_judged_overflow_raises_across_the_wire(judge_process):
    """The solution's ValueError on the full cache reaches the judge as a ValueError, and the rejected write is
    seen to change nothing."""
    result, _ = judged(judge_process, "from autograder.lab05 import check_quantized_kv_cache\n"
                                      "check_quantized_kv_cache(Int8LayerKVCache)\n",
                       {"Int8LayerKVCache": LAB05["Int8LayerKVCache"]})
    assert result["error"] is None, result["error"]


def _lab05_cell(cell: str, name: str, edit: dict[str, str]) -> Any:
    """The solution notebook's `name` from `cell`, with one edit (tests/labs/test_mutants_found.py)."""
    return solution_cells("05_quantization", cell, preamble="import torch", replace=edit)[name]


@pytest.mark.parametrize("check, name, fn, match", [
    ("check_pack_chunks", "pack_chunks", "pack_tokens_on_cpu", "device='meta'"),
    ("check_gptq", "gptq", "gptq_aliasing", "modified the w or H"),
    ("check_dequant_gemv", "triton_dequant_gemv", "gemv_x_not_contiguous", "drawn case"),
    ("check_quantized_kv_cache", "Int8LayerKVCache", "kv_cache_unchecked", "must raise ValueError"),
    ("check_quantized_kv_cache", "Int8LayerKVCache", "kv_cache_counts_first", "changed the cache"),
    ("check_int4_cpu_linear", "make_int4_linear", "int4_ranges_in_bf16", "bfloat16 weight"),
])
def test_new_contract_checks_judged(judge_process, check, name, fn, match):
    """Checks that look at what the learner's kernel holds (a tensor's device, an input changed in place, a view
    handed over as a view) see it when judged too, where only values cross the wire."""
    from tests.labs import test_lab03_checks, test_lab05_checks

    wrong = {"pack_tokens_on_cpu": test_lab03_checks.pack_tokens_on_cpu,
             "kv_cache_unchecked": test_lab05_checks.UncheckedCache,
             "kv_cache_counts_first": test_lab05_checks.CountsBeforeCheckingCache,
             "int4_ranges_in_bf16": test_lab05_checks.int4_ranges_in_bf16,
             "gptq_aliasing": _lab05_cell("ex4_code", "gptq", {"W = w.double().clone()": "W = w.double()"}),
             "gemv_x_not_contiguous": _lab05_cell("ex9_code", "triton_dequant_gemv",
                                                  {"](x.contiguous(), qweight": "](x, qweight"})}[fn]
    lab = "lab03" if name == "pack_chunks" else "lab05"
    result, _ = judged(judge_process, f"from autograder.{lab} import {check}\n{check}({name})\n", {name: wrong})
    assert result["error"] and match in result["error"]["evalue"], result["error"]
