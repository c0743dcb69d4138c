"""Tensors whose storage ends exactly at a page boundary, followed by a page nothing may read or write.

A Triton kernel run in the interpreter (TRITON_INTERPRET=1, the CPU tier) reads and writes its tensors through raw
host pointers. A load or store the kernel does not mask, one element past the end of a tensor, usually lands in
memory the process owns (the allocator's slack, or the NaN padding of a check's buffer) and goes unseen; on a GPU the
same access is undefined behaviour (an illegal address when it crosses the allocation). Here the page after the
tensor is mapped PROT_NONE (an anonymous mmap whose last page is mprotect-ed), so that access faults at once.

    guarded(shape, dtype, values=None) -> a contiguous tensor whose last byte is the last byte before the guard page
    faults_in_child(work)              -> whether work(), run in a forked child, died of a fault (SIGSEGV, SIGBUS)

A fault kills the process: run the code that may touch a guard page in a child (`faults_in_child`; the mutation
tests' contracts use autograder/mutation/contracts/guard_page.py's `in_fork`, which also sends the result back).
Linux only (mmap, mprotect, fork). Masked lanes of a Triton load or store are not touched, so a kernel whose
every access past the end is masked never faults.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import mmap
import os
import signal
import time
from typing import Callable

import torch

__all__ = ["guarded", "faults_in_child", "PAGE"]

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_KEEP: list[mmap.mmap] = []        # the mappings must outlive their tensors (torch.frombuffer does not own them)


def guarded(shape: tuple[int, ...], dtype: torch.dtype, values: torch.Tensor | None = None) -> torch.Tensor:
    """A contiguous tensor of `shape` and `dtype` (zeros, or `values`) that ends where an unreadable page begins."""
    count = 1
    for size in shape:
        count *= size
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    pages = max(1, -(-nbytes // PAGE))
    buf = mmap.mmap(-1, (pages + 1) * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if _libc.mprotect(ctypes.c_void_p(base + pages * PAGE), PAGE, 0) != 0:  # 0 is PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect of the guard page failed")
    _KEEP.append(buf)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=dtype, count=count, offset=pages * PAGE - nbytes)
    tensor = flat.view(shape)
    if values is not None:
        tensor.copy_(values.to(dtype))
    else:
        tensor.zero_()
    return tensor


def faults_in_child(work: Callable[[], object], timeout_s: float = 20.0) -> bool:
    """Whether work(), run in a forked child with its output silenced, died of a fault (SIGSEGV or SIGBUS). An
    exception in work is not a fault (the caller's own call, outside the child, reports it); a child still running
    after `timeout_s` is killed and counts as no fault."""
    pid = os.fork()
    if pid == 0:
        try:
            faulthandler.disable()             # the fault is the answer, not a crash to report
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                os.dup2(null.fileno(), 2)
            with contextlib.suppress(BaseException):
                work()
        finally:
            os._exit(0)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGSEGV, signal.SIGBUS)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(0.005)
