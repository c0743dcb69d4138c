"""Compile lab 04's Triton kernels ahead of time for a GPU target, without a GPU (run as a script).

    python tests/minigpt/compile_lab04_kernels.py [sm] [--quick]     # default sm 90 (H100/H200)

Triton lowers each kernel through TTIR, TTGIR, LLVM IR and PTX to a cubin (with its bundled ptxas) on any
machine; only launching needs a GPU. Prints one JSON line per kernel variant: the shared memory it needs.
Must run with TRITON_INTERPRET unset or 0 (the interpreter replaces the kernels before they can compile).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
warnings.simplefilter("ignore")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from minigpt.kernels.flash_attention import AUTOTUNE_CONFIGS, _flash_fwd_kernel  # noqa: E402
from minigpt.kernels.paged_decode import _paged_decode_split_kernel  # noqa: E402

DTYPE = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}


def _signature(kernel, pointers: dict[str, str], floats: set[str], constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        else:
            sig[name] = "fp32" if name in floats else "i32"
    return sig


def compile_flash(dtype: str, head_dim: int, causal: bool, block_m: int, block_n: int, warps: int, stages: int,
                  sm: int) -> dict:
    consts = dict(GROUP=4, HEAD_DIM=head_dim, BLOCK_D=head_dim, IS_CAUSAL=causal,
                  PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False, BLOCK_M=block_m, BLOCK_N=block_n)
    ptrs = {n: DTYPE[dtype] for n in ("Q", "K", "V", "O")} | {"LSE": "*fp32"}
    src = ASTSource(_flash_fwd_kernel, _signature(_flash_fwd_kernel, ptrs, {"qk_scale"}, consts), constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps, "num_stages": stages})
    return {"kernel": "flash_fwd", "dtype": dtype, "head_dim": head_dim, "causal": causal, "BLOCK_M": block_m,
            "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "shared_bytes": k.metadata.shared,
            "has_cubin": "cubin" in k.asm}


def compile_paged(dtype: str, group: int, head_dim: int, page: int, sm: int) -> dict:
    consts = dict(GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_D=head_dim,
                  PAGE_SIZE=page, BLOCK_T=max(16, page), PAGES_PER_SPLIT=max(1, 256 // page),
                  PRECISION="ieee" if dtype == "fp32" else "tf32", UPCAST=False)
    ptrs = {"Q": DTYPE[dtype], "K_POOL": DTYPE[dtype], "V_POOL": DTYPE[dtype], "BLOCK_TABLES": "*i32",
            "SEQ_LENS": "*i32", "O_PART": "*fp32", "LSE_PART": "*fp32"}
    sig = _signature(_paged_decode_split_kernel, ptrs, {"qk_scale"}, consts)
    k = triton.compile(ASTSource(_paged_decode_split_kernel, sig, constexprs=consts), target=GPUTarget("cuda", sm, 32),
                       options={"num_warps": 4, "num_stages": 2})
    return {"kernel": "paged_decode_split", "dtype": dtype, "group": group, "head_dim": head_dim, "page": page,
            "shared_bytes": k.metadata.shared, "has_cubin": "cubin" in k.asm}


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sm = int(args[0]) if args else 90
    if "--quick" in sys.argv:            # one variant of each kernel (the test in test_flash_kernels.py)
        c = AUTOTUNE_CONFIGS[0]
        print(json.dumps(compile_flash("fp16", 64, True, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                       c.num_stages, sm)), flush=True)
        print(json.dumps(compile_paged("bf16", 4, 128, 16, sm)), flush=True)
        return
    variants = [("fp16", 64, True), ("fp16", 128, False), ("bf16", 128, True), ("fp32", 64, True)]
    for dtype, d, causal in variants:
        c = AUTOTUNE_CONFIGS[0]
        print(json.dumps(compile_flash(dtype, d, causal, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"] if dtype != "fp32"
                                       else 32, c.num_warps, c.num_stages, sm)), flush=True)
    for c in AUTOTUNE_CONFIGS[1:]:
        print(json.dumps(compile_flash("fp16", 128, True, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                       c.num_stages, sm)), flush=True)
    for dtype, group, page in [("fp16", 4, 16), ("bf16", 1, 16), ("fp16", 8, 32), ("fp32", 2, 16)]:
        print(json.dumps(compile_paged(dtype, group, 128, page, sm)), flush=True)


if __name__ == "__main__":
    main()
