"""minigpt.teaching.profiling: operator categories, quiet profiling, the sums a profile table prints."""

from __future__ import annotations

import pytest
import torch

from minigpt.teaching.profiling import (calls_by_category, category, quiet_profile, self_seconds_by_category,
                                        self_seconds_total, top_operators)


@pytest.mark.parametrize("name,want", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::linear", "matmul"), ("aten::bmm", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"), ("aten::_softmax", "attention"),
    ("aten::mul", "other"), ("aten::copy_", "other"), ("cudaLaunchKernel", "other"),
])
def test_category(name, want):
    assert category(name) == want


def test_quiet_profile_records_and_keeps_stderr_clean(capfd):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    with quiet_profile() as prof:
        torch.softmax(a @ b, dim=-1).mul(2.0)
    out, err = capfd.readouterr()
    assert err == "", f"the profiler's start/stop lines reached stderr: {err!r}"
    seconds, calls = self_seconds_by_category(prof), calls_by_category(prof)
    assert seconds["matmul"] > 0 and calls["matmul"] >= 1 and calls["attention"] >= 1 and calls["other"] >= 1
    assert self_seconds_total(prof) == pytest.approx(sum(seconds.values()))
    top = top_operators(prof, 2)
    assert len(top) == 2 and top[0][1] >= top[1][1]
