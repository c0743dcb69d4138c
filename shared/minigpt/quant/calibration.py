"""Calibration data for GPTQ, AWQ and SmoothQuant: seeded windows of the training split, and the inputs
every projection sees when the full-precision model runs on them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minigpt.model import GPT
from minigpt.training.data import load_tokens, random_windows

__all__ = ["calibration_tokens", "capture_inputs"]


def calibration_tokens(n_sequences: int = 16, seq_len: int = 256, seed: int = 0, split: str = "train") -> Tensor:
    """(n_sequences, seq_len) token windows at seeded random offsets of the split (training by default:
    calibrating on the validation split would leak the data the perplexity is measured on)."""
    if n_sequences <= 0 or seq_len <= 0:
        raise ValueError(f"the calibration set is empty: n_sequences={n_sequences}, seq_len={seq_len}; "
                         "GPTQ, AWQ and SmoothQuant need activations to calibrate on")
    g = torch.Generator().manual_seed(seed)
    x, _ = random_windows(load_tokens(split), n_sequences, seq_len, g)
    return x


@torch.inference_mode()
def capture_inputs(model: GPT, tokens: Tensor, names: list[str], batch_size: int = 8) -> dict[str, Tensor]:
    """Run `model` on tokens (N, T) and return, for each module name, its inputs flattened to (N*T, in_features)
    in float32. Projections that read the same tensor (wq, wk, wv) share one stored copy."""
    if tokens.numel() == 0:
        raise ValueError("the calibration set is empty (0 tokens); pass at least one sequence of tokens")
    modules = dict(model.named_modules())
    unknown = [n for n in names if n not in modules]
    if unknown:
        raise ValueError(f"no modules named {unknown} in the model")
    chunks: dict[str, list[Tensor]] = {n: [] for n in names}
    by_input: dict[int, tuple[Tensor, Tensor]] = {}      # id(input) -> (input, flattened copy); the input is
                                                          # kept alive so its id is not reused by another tensor

    def hook(name: str):
        def fn(module: nn.Module, args: tuple) -> None:
            x = args[0]
            entry = by_input.get(id(x))
            if entry is None or entry[0] is not x:
                entry = by_input[id(x)] = (x, x.detach().float().reshape(-1, x.shape[-1]))
            chunks[name].append(entry[1])
        return fn

    handles = [modules[n].register_forward_pre_hook(hook(n)) for n in names]
    try:
        for i in range(0, len(tokens), batch_size):
            by_input.clear()
            model(tokens[i:i + batch_size].to(model.device))
    finally:
        for h in handles:
            h.remove()
    merged: dict[tuple[int, ...], Tensor] = {}
    out = {}
    for n in names:
        key = tuple(id(c) for c in chunks[n])        # the chunks are alive in `chunks`: ids are unique
        if key not in merged:
            merged[key] = torch.cat(chunks[n])
        out[n] = merged[key]
    return out
