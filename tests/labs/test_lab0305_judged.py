"""Labs 03 and 05 judged: a test cell run by a real judge process (autograder/judging/judge.py) against this process, which
plays the learner's kernel (autograder/judging/observe.py's side of the wire), with the solution notebook's answers.

Guards what made these checks slow or broken once their answers arrived as Remotes: lab 03's scheduler check asked
~116,000 questions over the wire (every attribute of every step), lab 05's fold_awq_scales deep-copied a judge's
model, and its Triton launches were counted in the judge, where no kernel runs. About 15 s on a 2-core CPU.
"""

from __future__ import annotations

import secrets
import socket
import tempfile
from typing import Any

import pytest

from autograder.judging import judge
from autograder.checking import wire
from autograder.judging.observe import observed_call
from tests.labs.notebook_solutions import solution_cells
from tests.labs.test_lab03_checks import SOLUTION as LAB03
from tests.labs.test_lab03_checks import Solution as Lab03Scheduler
from tests.labs.test_lab05_checks import SOLUTION as LAB05


class CountingEndpoint(wire.Endpoint):
    """The kernel's endpoint, counting the judge's requests it answers."""

    answered = 0

    def _answer(self, header: dict, blob: dict) -> None:
        self.answered += 1
        super()._answer(header, blob)


@pytest.fixture(scope="module")
def judge_process():
    process = judge.JudgeProcess(tempfile.mkdtemp(prefix="judge-"))
    yield process
    process.close()


def judged(process: judge.JudgeProcess, source: str, names: dict[str, Any]) -> tuple[dict, int]:
    """Run the test cell `source` in the judge, answering from `names`; (its result, requests answered here)."""
    token = secrets.token_hex(8)
    process.run(source, token, 30)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(process.path)
    with sock:
        endpoint = CountingEndpoint(sock, names=names, on_call=observed_call)
        endpoint.hello(token)
        endpoint.serve()
    return process.result(60), endpoint.answered


def test_lab03_scheduler_check_judged_in_few_requests(judge_process):
    result, requests = judged(judge_process, "from autograder.lab03 import check_scheduler\n"
                                             "check_scheduler(MyScheduler, max_examples=8)\n",
                              {"MyScheduler": Lab03Scheduler})
    assert result["error"] is None, result["error"]
    assert requests < 200, f"{requests} requests: the driver asks per attribute again"


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


def _lab05_cell(cell: str, name: str, edit: dict[str, str]) -> Any:
    """The solution notebook's `name` from `cell`, with one edit (tests/labs/test_mutants_found.py)."""
    return solution_cells("05_quantization", cell, preamble="import torch", replace=edit)[name]


@pytest.mark.parametrize("check, name, fn, match", [
    ("check_pack_chunks", "pack_chunks", "pack_tokens_on_cpu", "device='meta'"),
    ("check_gptq", "gptq", "gptq_aliasing", "modified the w or H"),
    ("check_dequant_gemv", "triton_dequant_gemv", "gemv_x_not_contiguous", "drawn case"),
])
def test_new_contract_checks_judged(judge_process, check, name, fn, match):
    """Checks that look at what the learner's kernel holds (a tensor's device, an input changed in place, a view
    handed over as a view) see it when judged too, where only values cross the wire."""
    from tests.labs import test_lab03_checks

    wrong = {"pack_tokens_on_cpu": test_lab03_checks.pack_tokens_on_cpu,
             "gptq_aliasing": _lab05_cell("ex4_code", "gptq", {"W = w.double().clone()": "W = w.double()"}),
             "gemv_x_not_contiguous": _lab05_cell("ex9_code", "triton_dequant_gemv",
                                                  {"](x.contiguous(), qweight": "](x, qweight"})}[fn]
    lab = "lab03" if name == "pack_chunks" else "lab05"
    result, _ = judged(judge_process, f"from autograder.{lab} import {check}\n{check}({name})\n", {name: wrong})
    assert result["error"] and match in result["error"]["evalue"], result["error"]
