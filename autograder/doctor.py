"""`make doctor`: what this machine can run, and which checks will be skipped and why."""

from __future__ import annotations

import os
import platform
import re
import shutil
from pathlib import Path

from autograder.machine import cpu_name
from autograder.paths import REPO_ROOT

_GPU_CHECK = re.compile(r"require_gpu\(\s*[\"']([^\"']+)[\"']")


def gpu_checks(root: Path = REPO_ROOT) -> dict[str, list[str]]:
    """{lab folder: [what, ...]} for every require_gpu("what") in the source notebooks."""
    import nbformat

    out: dict[str, list[str]] = {}
    for nb_path in sorted((root / "solutions").glob("*/*.ipynb")):
        try:
            nb = nbformat.read(str(nb_path), as_version=4)
        except Exception:
            continue
        whats = [m for c in nb.cells if c.cell_type == "code" for m in _GPU_CHECK.findall(c.source)]
        if whats:
            out[nb_path.parent.name] = whats
    return out


def report(root: Path = REPO_ROOT) -> list[str]:
    """The doctor's report as lines of text."""
    lines = [f"python      {platform.python_version()} ({platform.system()} {platform.machine()})",
             f"cpu         {cpu_name()}, {os.cpu_count()} logical cores"]
    try:
        import torch
    except Exception as exc:  # pragma: no cover - the venv always has torch
        return lines + [f"torch       NOT IMPORTABLE ({exc}); run `make lab` or `make test` to set up .venv"]
    gpu = torch.cuda.is_available()
    lines.append(f"torch       {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
    if gpu:
        name = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        mem = torch.cuda.get_device_properties(0).total_memory / 2**30
        lines.append(f"gpu         {name}, compute capability {major}.{minor}, {mem:.0f} GiB")
    else:
        lines.append("gpu         none (torch.cuda.is_available() is False)")
    try:
        import triton
        tv = triton.__version__
    except Exception as exc:
        tv = None
        lines.append(f"triton      not importable ({type(exc).__name__}: {exc})")
    if tv:
        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        if gpu and not interpret:
            mode = "compiled to GPU code"
        elif gpu:
            mode = "interpreted on the CPU (TRITON_INTERPRET=1 is set; unset it to compile)"
        else:
            mode = ("interpreted on the CPU (TRITON_INTERPRET=1)" if interpret else
                    "no GPU: kernels run only with TRITON_INTERPRET=1 (interpreted, slow, correctness only)")
        lines.append(f"triton      {tv}: {mode}")
    from minigpt.timing import device_class
    dc = device_class()
    lines.append(f"device class {dc} (speed thresholds are looked up under this key)")

    from autograder.gpu_tier.calibrate import REGISTRY
    from autograder.checking.thresholds import status

    for tier, klass in [("cpu", "cpu")] + ([("gpu", dc)] if gpu else []):
        checks = [s.name for s in REGISTRY if s.tier == tier]
        missing = [c for c in checks if status(c, klass)[0] is None]
        state = (f"all {len(checks)} calibrated" if not missing else
                 f"{len(checks) - len(missing)} of {len(checks)} calibrated; not: {', '.join(missing)} "
                 "(run `make calibrate` on this machine)")
        lines.append(f"calibration {tier} tier speed checks for {klass}: {state}")

    lines.append("tiers       CPU tier (correctness): runs here")
    checks = gpu_checks(root)
    if gpu:
        lines.append("            GPU tier (speed, memory): runs here")
    else:
        n = sum(len(v) for v in checks.values())
        lines.append(f"            GPU tier (speed, memory): SKIPPED here, no CUDA GPU ({n} check(s); under "
                     "nbgrader autograde they score 0)")
        for lab, whats in checks.items():
            for w in whats:
                lines.append(f"              - {lab}: {w}")

    data = root / "data"
    tok = data / "tokenizer"
    ck = data / "checkpoints"
    lines.append(f"data        corpus: {'yes' if (data / 'corpus' / 'train.txt').exists() else 'MISSING'}; "
                 f"tokenizer: {'yes' if any(tok.glob('*')) else 'MISSING (make data)'}; "
                 f"checkpoints: {', '.join(sorted(p.stem for p in ck.glob('*.safetensors'))) or 'MISSING (make models)'}")
    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    lines.append(f"browser     chromium: {chromium or 'missing (make browser-deps installs it; browser tests skip)'}")
    from autograder.judging import sandbox

    why = sandbox.probe()
    lines.append("sandbox     " + ("bubblewrap: submissions are graded in a sandbox" if why is None else
                                   f"NONE: {why} (make autograde refuses without --unsafe)"))
    return lines


def main() -> int:
    for line in report():
        print(line)
    return 0
