"""Every cost model of the course prices a forward pass on one rule, `calculators.forward_kernels` + `kernels_time`
(lab 00's): the simulated GPU of lab 03, the parallel plan of lab 07, the chunked prefill of lab 09 and the roofline
report of lab 00's widget agree with it, and with lab 00's decode and prefill formulas, on shared cases."""

from __future__ import annotations

import pytest

from minigpt.engine.request import Request, Sequence
from minigpt.engine.scheduler import ScheduledChunk, SchedulerOutput
from minigpt.longctx.serving_cost import chunked_prefill
from minigpt.costmodel import calculators as calc
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.parallel_cost import INTERCONNECTS, parallel_plan, stage_kernels
from minigpt.costmodel.serving_simulator import step_cost

GPU = ACCELERATORS["H100-SXM"]
PEAK, BW = GPU.peak("bf16"), GPU.memory_bandwidth
SHAPES = [calc.PRESETS[name] for name in ("Llama-3-8B", "Llama-3-70B", "minigpt-target")]
CASES = [(1, 1), (1, 4096), (8, 256), (64, 1024), (512, 300)]        # (batch, context)


def _chunk(start: int, n: int) -> ScheduledChunk:
    return ScheduledChunk(Sequence(Request(0, [1] * (start + n), 1)), start, [1] * n, list(range(n)))


def test_forward_kernels_is_lab_00s_decode_and_prefill() -> None:
    for shape in SHAPES:
        for batch, context in CASES:
            kernels = calc.forward_kernels(shape, batch, batch * context, batch * context)
            assert kernels == calc.decode_kernels(shape, context, batch)
            assert sum(f for f, _ in kernels.values()) == calc.decode_flops(shape, context, batch)
            assert sum(b for _, b in kernels.values()) == calc.decode_bytes(shape, context, batch)
        prefill = calc.forward_kernels(shape, 300, 300 * 301 // 2, 300)
        assert sum(f for f, _ in prefill.values()) == calc.prefill_flops(shape, 300)
        assert sum(b for _, b in prefill.values()) == calc.prefill_bytes(shape, 300)


def test_kernels_time_adds_each_kernels_roofline_not_one_lumped_point() -> None:
    shape = calc.PRESETS["Llama-3-8B"]
    kernels = calc.decode_kernels(shape, 1024, 512)
    per_kernel = sum(max(f / PEAK, b / BW) for f, b in kernels.values())
    lumped = max(calc.decode_flops(shape, 1024, 512) / PEAK, calc.decode_bytes(shape, 1024, 512) / BW)
    assert calc.kernels_time(kernels, PEAK, BW) == pytest.approx(per_kernel, rel=1e-12)
    assert per_kernel > lumped * 1.05          # at batch 512 the matmuls are compute-bound, attention memory-bound


def test_the_simulated_gpu_charges_a_decode_step_as_lab_00_does() -> None:
    for shape in SHAPES:
        for batch, context in CASES:
            output = SchedulerOutput([_chunk(context - 1, 1) for _ in range(batch)])
            assert step_cost(output, shape, GPU) == pytest.approx(calc.decode_step_time(shape, context, batch, PEAK, BW),
                                                                  rel=1e-12)


def test_the_simulated_gpu_and_the_chunked_prefill_price_a_chunk_alike() -> None:
    for shape in SHAPES:
        plan = chunked_prefill(shape, 1000, 256, GPU)
        for chunk in plan.chunks:
            output = SchedulerOutput([_chunk(chunk.start, chunk.tokens)])
            assert step_cost(output, shape, GPU) == pytest.approx(chunk.time_s, rel=1e-12)
        whole = chunked_prefill(shape, 1000, 1000, GPU)
        assert whole.flops == calc.prefill_flops(shape, 1000) == plan.flops
        assert whole.bytes == calc.prefill_bytes(shape, 1000)


def test_a_chunk_reads_embedding_rows_not_the_embedding_table() -> None:
    shape = calc.PRESETS["Llama-3-8B"]                      # untied: the table is 1.05 GB of 16.06
    chunk = chunked_prefill(shape, 8, 8, GPU).chunks[0]
    assert chunk.bytes < calc.weight_bytes(shape) - 1e9


def test_the_parallel_plan_on_one_gpu_is_lab_00s_decode_step() -> None:
    link = INTERCONNECTS["NVLink 4"]
    for shape in SHAPES:
        for batch, context in CASES:
            plan = parallel_plan(shape, GPU, link, tp=1, context_len=context, batch=batch)
            assert plan.compute_s == pytest.approx(calc.decode_step_time(shape, context, batch, PEAK, BW), rel=1e-12)
            assert stage_kernels(shape, 1, 1, 0, context, batch) == calc.decode_kernels(shape, context, batch)


def test_pipeline_stages_add_up_to_the_whole_model() -> None:
    shape = calc.PRESETS["Llama-3-70B"]
    for pp in (2, 4, 8):
        stages = [stage_kernels(shape, 1, pp, i, 512, 4) for i in range(pp)]
        whole = calc.decode_kernels(shape, 512, 4)
        for kind in ("weights", "attention"):
            assert tuple(sum(s[kind][i] for s in stages) for i in (0, 1)) == whole[kind]


def test_tensor_parallel_ranks_share_the_flops() -> None:
    shape = calc.PRESETS["Llama-3-70B"]                      # 8 KV heads: no replication up to tp = 8
    whole = calc.decode_kernels(shape, 512, 4)
    for tp in (2, 4, 8):
        rank = stage_kernels(shape, tp, 1, 0, 512, 4)
        assert tp * rank["weights"][0] == whole["weights"][0]
        assert tp * rank["attention"][0] == whole["attention"][0]
        assert tp * rank["attention"][1] == whole["attention"][1]


def test_the_roofline_report_times_kernel_by_kernel() -> None:
    shape = calc.PRESETS["Llama-3-8B"]
    report = calc.roofline_report(shape, PEAK, BW, batch=512, seq_len=1024)
    assert report["decode"].time_s == pytest.approx(calc.decode_step_time(shape, 1024, 512, PEAK, BW), rel=1e-12)
    prefill = calc.forward_kernels(shape, 512 * 1024, 512 * (1024 * 1025 // 2), 512 * 1024)
    assert report["prefill"].time_s == pytest.approx(calc.kernels_time(prefill, PEAK, BW), rel=1e-12)
