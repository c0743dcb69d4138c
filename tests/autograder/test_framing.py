"""Frames of the wire: their tensor blob is what safetensors.torch.save writes, byte for byte, on every dtype and
shape the wire can carry (the oracle: safetensors' own save), and it loads back equal."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from autograder.checking.framing import safetensors_bytes

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4)]


def _drawn(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 50
    if dtype == torch.bool:
        return x > 0
    if dtype == torch.complex64:
        return torch.complex(x, -x)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_blob_is_safetensors_own_bytes(dtype):
    tensors = {f"t{i}": _drawn(dtype, shape, i) for i, shape in enumerate(SHAPES)}
    tensors["rng"] = torch.get_rng_state()
    tensors["gen"] = torch.Generator().manual_seed(3).get_state()
    blob = safetensors_bytes(tensors)
    assert blob == save(tensors)
    back = load(blob)
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


def test_what_the_fast_path_leaves_to_save_is_still_saved():
    """An empty tensor, a strided view and a Parameter go through safetensors.torch.save (same bytes)."""
    base = torch.arange(12.0).reshape(3, 4)
    for tensors in ({"empty": torch.zeros(0, 3)}, {"view": base.t()[1:]},
                    {"param": torch.nn.Parameter(torch.ones(2))}):
        try:
            want = save({k: v.contiguous() for k, v in tensors.items()})
        except ValueError:
            continue
        got = safetensors_bytes({k: v.contiguous() for k, v in tensors.items()})
        assert got == want
    with pytest.raises(ValueError, match="non contiguous"):       # save's own refusal, unchanged
        safetensors_bytes({"view": base.t()})
