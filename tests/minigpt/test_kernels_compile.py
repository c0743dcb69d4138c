"""Every Triton kernel of the course compiles ahead of time to sm_80 (A100) and sm_90 (H100) cubins without a GPU
(Triton's bundled ptxas), within the targets' shared-memory limit and without register spills. Catches what the
interpreter accepts but the GPU compiler does not. About 25 s on a quiet 2-core machine (14 compilations); the full list
of variants: `python tests/minigpt/compile_kernels.py --markdown`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("compile_kernels.py")
# Not imported from the script: importing it sets TRITON_INTERPRET=0 in this process, which would stop later tests in
# the same worker from interpreting kernels. Keep these in step with its KERNELS and SHARED_LIMIT.
KERNELS = {"flash_fwd", "flash_bwd_preprocess", "flash_bwd_dkdv", "flash_bwd_dq", "paged_decode_split", "dequant_gemv"}
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}


def _compile(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def test_every_kernel_compiles_for_ampere_and_hopper_without_a_gpu():
    rows = _compile("--quick", "--sm", "80", "--sm", "90")
    assert {(r["kernel"], r["sm"]) for r in rows} == {(k, sm) for k in KERNELS for sm in (80, 90)}
    assert {r["bits"] for r in rows if r["kernel"] == "dequant_gemv"} == {4, 8}
    for r in rows:
        assert r["has_cubin"], r
        assert 0 < r["registers"] <= 255 and r["spill_bytes"] == 0, f"registers or spills out of bounds: {r}"
        assert 0 < r["shared_bytes"] + max(r["static_shared_bytes"], 0) <= SHARED_LIMIT[r["sm"]], r
