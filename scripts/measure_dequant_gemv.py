"""Lab 05's dequantizing GEMV on a GPU: the reference kernel at several tile sizes against a variant that applies
each group's scale once per group (the reference loads one float32 scale per weight), INT8 and INT4, batch 1, bf16 x,
at 8192^2 and 16384^2, against a bf16 matmul of the same shape. Time is triton.testing.do_bench's median over four
weight sets in turn (an INT4 8192^2 matrix is 32 MB, under an H200's 60 MB L2); GB/s counts the quantized weights
and scales read once. Without a GPU it checks the variant against the reference in Triton's interpreter.

    python scripts/measure_dequant_gemv.py        # results of 2026-11-26 (H200): autograder/calibration/dequant_gemv_variants.cuda-sm90.txt
"""
import itertools
import sys

import torch
import triton
import triton.language as tl

from minigpt.kernels.dequant_gemv import dequant_gemv, dequant_gemv_reference

@triton.jit
def grouped_kernel(x_ptr, w_ptr, s_ptr, y_ptr, N, K, n_groups,
                   GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    G: tl.constexpr = BLOCK_K // GROUP
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        g = k0 // GROUP + tl.arange(0, G)
        g_ok = row_ok[:, None] & (g < n_groups)[None, :]
        s = tl.load(s_ptr + rows[:, None] * n_groups + g[None, :], mask=g_ok, other=0.0)
        if BITS == 8:
            cols = k0 + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (cols < K)[None, :]
            w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=0).to(tl.float32)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            part = tl.sum(tl.reshape(w * x[None, :], (BLOCK_N, G, GROUP)), axis=2)
        else:
            HALF: tl.constexpr = BLOCK_K // 2
            j = k0 // 2 + tl.arange(0, HALF)
            ok = row_ok[:, None] & (j < K // 2)[None, :]
            b = tl.load(w_ptr + rows[:, None] * (K // 2) + j[None, :], mask=ok, other=0).to(tl.int32)
            lo = (((b & 15) ^ 8) - 8).to(tl.float32)
            hi = ((((b >> 4) & 15) ^ 8) - 8).to(tl.float32)
            xe = tl.load(x_ptr + 2 * j, mask=j < K // 2, other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + 2 * j + 1, mask=j < K // 2, other=0.0).to(tl.float32)
            part = tl.sum(tl.reshape(lo * xe[None, :] + hi * xo[None, :], (BLOCK_N, G, GROUP // 2)), axis=2)
        acc += tl.sum(part * s, axis=1)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)

def grouped(x, qw, scale, bits, group, bn=16, bk=256, warps=4, stages=3):
    N, K = qw.shape[0], x.shape[0]
    y = torch.empty(N, dtype=x.dtype, device=x.device)
    grouped_kernel[(triton.cdiv(N, bn),)](x, qw, scale, y, N, K, K // group, GROUP=group, BITS=bits,
                                          BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return y

def case(bits, N, K, group=128, seed=0, dev="cuda"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8 if bits == 4 else -127, 8 if bits == 4 else 128, (N, K), generator=g, dtype=torch.int16)
    if bits == 4:
        u = (q & 15).to(torch.uint8); qw = (u[:, 0::2] | (u[:, 1::2] << 4))
    else:
        qw = q.to(torch.int8)
    scale = torch.rand(N, K // group, generator=g) * 0.01 + 0.001
    x = torch.randn(K, generator=g)
    return x.to(dev, torch.bfloat16 if dev == "cuda" else torch.float32), qw.to(dev), scale.to(dev)

def rel(a, b): return ((a.float() - b.float()).norm() / b.float().norm()).item()

if __name__ == "__main__":
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":   # correctness in the interpreter
        for bits in (8, 4):
            x, qw, s = case(bits, 40, 512, dev="cpu")
            for bn, bk in [(16, 256), (8, 128), (32, 512)]:
                print(bits, bn, bk, rel(grouped(x, qw, s, bits, 128, bn, bk), dequant_gemv_reference(x, qw, s, bits, 128)))
        sys.exit()
    from triton.testing import do_bench
    rows = []
    for (N, K), bits in itertools.product([(8192, 8192), (16384, 16384)], (8, 4)):
        sets = [case(bits, N, K, seed=i) for i in range(4)]
        wd = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        it = itertools.cycle(range(4))
        def rot(f):
            def go():
                x, qw, s = sets[next(it)]; f(x, qw, s)
            return go
        x, qw, s = sets[0]
        want = dequant_gemv_reference(x, qw, s, bits, 128)
        wbytes = qw.nbytes + s.nbytes
        dense = do_bench(lambda: torch.matmul(wd[next(it) % 2], sets[0][0]), warmup=25, rep=100, return_mode="median")
        variants = {"current(16,128)": lambda x, qw, s: dequant_gemv(x, qw, s, bits, 128)}
        for bn, bk in [(32, 256), (16, 512), (64, 256)]:
            variants[f"current({bn},{bk})"] = (lambda bn, bk: lambda x, qw, s: dequant_gemv(x, qw, s, bits, 128, block_n=bn, block_k=bk))(bn, bk)
        for bn, bk, w, st in [(16, 256, 4, 3), (32, 256, 4, 3), (16, 512, 4, 3), (32, 512, 8, 3), (8, 1024, 4, 2), (64, 256, 8, 3)]:
            variants[f"grouped({bn},{bk},w{w},s{st})"] = (lambda bn, bk, w, st: lambda x, qw, s: grouped(x, qw, s, bits, 128, bn, bk, w, st))(bn, bk, w, st)
        for name, f in variants.items():
            try:
                e = rel(f(x, qw, s), want)
                t = do_bench(rot(f), warmup=25, rep=100, return_mode="median")
                rows.append((N, bits, name, t * 1e3, wbytes / t / 1e6, dense / t, e))
            except Exception as ex:
                rows.append((N, bits, name, float("nan"), float("nan"), float("nan"), repr(ex)[:80]))
        rows.append((N, bits, "bf16 matmul", dense * 1e3, N * K * 2 / dense / 1e6, 1.0, 0))
        for r in rows[-len(variants) - 1:]:
            print(f"N=K={r[0]:6d} INT{r[1]} {r[2]:28s} {r[3]:9.1f} us {r[4]:7.0f} GB/s {r[5]:5.2f}x dense  err {r[6]}", flush=True)
