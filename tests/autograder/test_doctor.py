"""autograder.doctor: the report names the hardware, versions, tier and the GPU checks that will be skipped."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from autograder import doctor


def test_report_lines():
    text = "\n".join(doctor.report())
    for key in ("python", "cpu", "torch", "gpu", "triton", "device class", "tiers", "data", "sandbox"):
        assert key in text
    import torch
    if not torch.cuda.is_available():
        assert "SKIPPED here, no CUDA GPU" in text
        assert "TRITON_INTERPRET=1" in text


def test_gpu_checks_found_in_source_notebooks(tmp_path):
    d = tmp_path / "solutions" / "07_x"
    d.mkdir(parents=True)
    nb = new_notebook(cells=[new_code_cell('if require_gpu("fused kernel speed"):\n    check()'),
                             new_code_cell("x = 1")])
    nbformat.write(nb, str(d / "07_x.ipynb"))
    assert doctor.gpu_checks(tmp_path) == {"07_x": ["fused kernel speed"]}


def test_cli_doctor(capsys):
    from autograder.cli import main
    assert main(["doctor"]) == 0
    assert "device class" in capsys.readouterr().out
