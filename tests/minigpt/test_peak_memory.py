"""PeakMemory counts the bytes of the tensors a block allocates, as they are freed (lab 04's CPU measurement)."""

from __future__ import annotations

import torch

from minigpt.teaching.peak_memory import PeakMemory, peak_bytes


def test_peak_is_the_most_bytes_alive_at_once():
    with PeakMemory() as mem:
        a = torch.empty(1000)                 # 4000 bytes
        b = torch.empty(500)                  # 6000 alive
        del a                                 # 2000
        c = torch.empty(200)                  # 2800
    assert (mem.peak, mem.allocated, mem.current) == (6000, 6800, 2800)
    del b, c


def test_views_and_in_place_results_allocate_nothing():
    x = torch.zeros(256)
    with PeakMemory() as mem:
        x.add_(1)
        x.view(16, 16).t()
        x[:10]
    assert mem.peak == 0


def test_inputs_are_not_counted_and_temporaries_are():
    x = torch.ones(1024)                      # 4096 bytes, made before the block
    assert peak_bytes(lambda t: (t * 2) * 3, x) == 2 * 4096      # t * 2 is alive while (t * 2) * 3 is made


def test_meta_tensors_count_like_real_ones():
    g = torch.Generator().manual_seed(0)
    real = torch.randn(64, 64, generator=g)
    meta = torch.empty(64, 64, device="meta")
    f = lambda t: torch.softmax(t @ t.T, -1) @ t            # noqa: E731
    assert peak_bytes(f, real) == peak_bytes(f, meta) > 0
