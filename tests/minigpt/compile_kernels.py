"""Compile every Triton kernel of the course ahead of time for GPU targets, without a GPU (run as a script).

    python tests/minigpt/compile_kernels.py [--sm 80 --sm 90] [--quick] [--markdown]

Triton lowers each kernel through TTIR, TTGIR, LLVM IR and PTX to a cubin with its bundled ptxas on any machine; only
launching needs a GPU. For each variant it prints one JSON line: the dynamic shared memory Triton reserves, and the
registers per thread, spill bytes (the stack frame in local memory) and static shared memory that
`cuobjdump -res-usage` (also bundled) reads from the cubin. Must run with TRITON_INTERPRET unset or 0 (the interpreter replaces the kernels before they can
compile); the test in test_kernels_compile.py runs it in a subprocess for that reason.

To add a kernel: write a function `variants_<name>(quick) -> list[Variant]` below and add it to KERNELS (and its name
to the test's KERNELS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
warnings.simplefilter("ignore")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

DTYPE = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}     # most dynamic shared memory per block: A100, H100


@dataclass
class Variant:
    """One compilation: a kernel, its constexprs and pointer types, launch options, and labels for the report."""

    kernel: Any
    name: str
    constexprs: dict[str, Any]
    pointers: dict[str, str]
    floats: set[str] = field(default_factory=set)
    options: dict[str, int] = field(default_factory=lambda: {"num_warps": 4, "num_stages": 2})
    labels: dict[str, Any] = field(default_factory=dict)


def signature(kernel: Any, pointers: dict[str, str], floats: set[str], constexprs: dict) -> dict[str, str]:
    return {name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name in floats else "i32")
            for name in kernel.arg_names}


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG (registers per thread), STACK (bytes of per-thread stack frame in local memory: where ptxas spills registers
    that do not fit; 0 = no spills), SHARED (static shared memory) of the cubin's kernel."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = dict(re.findall(r"\b(REG|LOCAL|SHARED|STACK):(\d+)", out.split("Function", 1)[-1]))
    return {"registers": int(found.get("REG", -1)),
            "spill_bytes": int(found.get("STACK", -1)) + int(found.get("LOCAL", 0)),
            "static_shared_bytes": int(found.get("SHARED", -1))}


def compile_variant(v: Variant, sm: int) -> dict[str, Any]:
    src = ASTSource(v.kernel, signature(v.kernel, v.pointers, v.floats, v.constexprs), constexprs=v.constexprs)
    k = triton.compile(src, target=GPUTarget("cuda", sm, 32), options=v.options)
    return {"kernel": v.name, "sm": sm, **v.labels, **{k_: v.options[k_] for k_ in ("num_warps", "num_stages")},
            "shared_bytes": k.metadata.shared, **resource_usage(k.asm["cubin"]), "has_cubin": bool(k.asm.get("cubin"))}


# ---------------------------------------------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------------------------------------------

def variants_flash_fwd(quick: bool) -> list[Variant]:
    """Lab 04's forward kernel: every dtype / head_dim / mask on the first config, every AUTOTUNE_CONFIGS entry."""
    from minigpt.kernels.flash_attention import AUTOTUNE_CONFIGS, _flash_fwd_kernel

    def one(dtype: str, d: int, causal: bool, cfg: Any, block_n: int | None = None, split: bool = True) -> Variant:
        bm, bn = cfg.kwargs["BLOCK_M"], block_n or cfg.kwargs["BLOCK_N"]
        consts = dict(GROUP=4, HEAD_DIM=d, BLOCK_D=d, IS_CAUSAL=causal, PRECISION="ieee" if dtype == "fp32" else "tf32",
                      UPCAST=False, BLOCK_M=bm, BLOCK_N=bn, CAUSAL_SPLIT=split)
        return Variant(_flash_fwd_kernel, "flash_fwd", consts, {n: DTYPE[dtype] for n in ("Q", "K", "V", "O")} |
                       {"LSE": "*fp32"}, {"qk_scale"}, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                       {"dtype": dtype, "head_dim": d, "causal": causal, "causal_split": split, "BLOCK_M": bm,
                        "BLOCK_N": bn})

    first = AUTOTUNE_CONFIGS[0]
    if quick:
        return [one("fp16", 64, True, first)]
    out = [one(dt, d, c, first, 32 if dt == "fp32" else None)
           for dt, d, c in [("fp16", 64, True), ("fp16", 128, False), ("bf16", 128, True), ("fp32", 64, True)]]
    out.append(one("fp16", 64, True, first, split=False))            # the single masked loop, for comparison
    return out + [one("fp16", 128, True, cfg) for cfg in AUTOTUNE_CONFIGS[1:]]


def variants_flash_bwd(quick: bool) -> list[Variant]:
    """Lab 04's backward: the delta preprocessing, dK/dV and dQ kernels, with flash_attention_backward's GPU tiles
    and warps (backward_tiles), 1 stage."""
    import torch

    from minigpt.kernels.flash_backward import _bwd_dkdv_kernel, _bwd_dq_kernel, _bwd_preprocess_kernel, backward_tiles

    def preprocess(dtype: str, d: int) -> Variant:
        return Variant(_bwd_preprocess_kernel, "flash_bwd_preprocess", dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_M=32),
                       {"O": DTYPE[dtype], "DO": DTYPE[dtype], "DELTA": "*fp32"},
                       options={"num_warps": 4, "num_stages": 1}, labels={"dtype": dtype, "head_dim": d})

    def grads(kernel: Any, name: str, dtype: str, d: int, causal: bool, group: int) -> Variant:
        t = backward_tiles({"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype], d)
        dkdv = name == "flash_bwd_dkdv"
        bm, bn, warps = (t.dkdv_m, t.dkdv_n, t.dkdv_warps) if dkdv else (t.dq_m, t.dq_n, t.dq_warps)
        consts = dict(GROUP=group, HEAD_DIM=d, BLOCK_D=d, IS_CAUSAL=causal,
                      PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False, BLOCK_M=bm, BLOCK_N=bn)
        outs = ("DK", "DV") if dkdv else ("DQ",)
        ptrs = {n: DTYPE[dtype] for n in ("Q", "K", "V", "DO", *outs)} | {"LSE": "*fp32", "DELTA": "*fp32"}
        return Variant(kernel, name, consts, ptrs, {"sm_scale"}, {"num_warps": warps, "num_stages": 1},
                       {"dtype": dtype, "head_dim": d, "causal": causal, "group": group, "BLOCK_M": bm,
                        "BLOCK_N": bn})

    shapes = [("fp16", 64, True, 1)] if quick else [("fp16", 64, True, 1), ("bf16", 128, True, 4),
                                                    ("fp16", 128, False, 2), ("fp32", 64, True, 1)]
    return ([preprocess("fp16", 64)] + ([] if quick else [preprocess("bf16", 128)]) +
            [grads(_bwd_dkdv_kernel, "flash_bwd_dkdv", *s) for s in shapes] +
            [grads(_bwd_dq_kernel, "flash_bwd_dq", *s) for s in shapes])


def variants_paged_decode(quick: bool) -> list[Variant]:
    """Lab 04's split-KV decode kernel (flash-decoding over the paged cache)."""
    from minigpt.kernels.paged_decode import _paged_decode_split_kernel

    def one(dtype: str, group: int, d: int, page: int) -> Variant:
        consts = dict(GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=d, BLOCK_D=d,
                      PAGE_SIZE=page, BLOCK_T=max(16, page), PAGES_PER_SPLIT=max(1, 256 // page),
                      PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False)
        ptrs = {"Q": DTYPE[dtype], "K_POOL": DTYPE[dtype], "V_POOL": DTYPE[dtype], "BLOCK_TABLES": "*i32",
                "SEQ_LENS": "*i32", "O_PART": "*fp32", "LSE_PART": "*fp32"}
        return Variant(_paged_decode_split_kernel, "paged_decode_split", consts, ptrs, {"qk_scale"},
                       labels={"dtype": dtype, "group": group, "head_dim": d, "page": page})

    if quick:
        return [one("bf16", 4, 128, 16)]
    return [one(*a) for a in [("fp16", 4, 128, 16), ("bf16", 1, 128, 16), ("fp16", 8, 128, 32), ("fp32", 2, 128, 16)]]


def variants_dequant_gemv(quick: bool) -> list[Variant]:
    """Lab 05's fused dequantizing GEMV, INT8 and INT4, with the launcher's default tiles (16 x 128)."""
    from minigpt.kernels.dequant_gemv import _dequant_gemv_kernel

    def one(bits: int, x_dtype: str) -> Variant:
        consts = dict(GROUP=128, BITS=bits, BLOCK_N=16, BLOCK_K=128)
        ptrs = {"x_ptr": DTYPE[x_dtype], "w_ptr": "*i8" if bits == 8 else "*u8", "s_ptr": "*fp32",
                "y_ptr": DTYPE[x_dtype]}
        return Variant(_dequant_gemv_kernel, "dequant_gemv", consts, ptrs,
                       labels={"bits": bits, "x_dtype": x_dtype, "BLOCK_N": 16, "BLOCK_K": 128})

    return [one(8, "bf16"), one(4, "bf16")] + ([] if quick else [one(8, "fp16"), one(4, "fp32")])


KERNELS: dict[str, Callable[[bool], list[Variant]]] = {
    "flash_fwd": variants_flash_fwd,
    "flash_bwd": variants_flash_bwd,
    "paged_decode_split": variants_paged_decode,
    "dequant_gemv": variants_dequant_gemv,
}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| kernel | variant | sm | warps x stages | registers/thread | spills (B) | shared (B) |",
             "|---|---|---|---|---|---|---|"]
    skip = {"kernel", "sm", "num_warps", "num_stages", "shared_bytes", "registers", "spill_bytes",
            "static_shared_bytes", "has_cubin"}
    for r in rows:
        variant = ", ".join(f"{k}={v}" for k, v in r.items() if k not in skip)
        lines.append(f"| {r['kernel']} | {variant} | {r['sm']} | {r['num_warps']} x {r['num_stages']} | "
                     f"{r['registers']} | {r['spill_bytes']} | {r['shared_bytes'] + max(r['static_shared_bytes'], 0)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sm", type=int, action="append", help="target compute capability (repeatable; default 80 and 90)")
    p.add_argument("--quick", action="store_true", help="one or two variants per kernel (the CI test)")
    p.add_argument("--kernel", action="append", choices=sorted(KERNELS), help="only this kernel (repeatable)")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table at the end")
    args = p.parse_args(argv)
    rows = []
    for sm in args.sm or [80, 90]:
        for name, variants in KERNELS.items():
            if args.kernel and name not in args.kernel:
                continue
            for v in variants(args.quick):
                row = compile_variant(v, sm)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
