"""Load a Hugging Face Llama-family folder as the course's `GPT` (what `load_model("/path/to/folder")` calls).

    model = load_hf_model("/models/SmolLM2-135M")          # config.json + *.safetensors (+ index), fp32 on CPU
    tok = HFTokenizer.from_folder("/models/SmolLM2-135M")   # minigpt.hf.tokenizer

Nothing is downloaded: the folder must already be on disk (e.g. from `huggingface-cli download`).
Weights in bf16/fp16/fp32 are cast to `dtype`; a tied model's file may or may not hold lm_head.weight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from minigpt.config import ModelConfig
from minigpt.hf.config import config_from_hf
from minigpt.hf.tokenizer import read_json
from minigpt.hf.weights import checkpoint_tensors
from minigpt.model import GPT

__all__ = ["is_hf_folder", "load_hf_config", "load_hf_model"]


def is_hf_folder(name_or_path: str | Path) -> bool:
    """True for a folder holding a config.json (a Hugging Face model folder)."""
    p = Path(name_or_path)
    return p.is_dir() and (p / "config.json").exists()


def load_hf_config(folder: str | Path, *, max_seq_len: int | None = None) -> ModelConfig:
    """The course config of the folder's config.json (UnsupportedModel naming the field it cannot run)."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder: no config.json")
    return config_from_hf(read_json(path), max_seq_len=max_seq_len)


def load_hf_model(folder: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  attention: str = "sdpa", max_seq_len: int | None = None, **model_kwargs: Any) -> GPT:
    """Build the GPT of the folder's config and copy every weight in by name; returns it in eval mode.

    Every course parameter must be in the files and every tensor of the files must have a place (else
    ValueError naming them); `max_seq_len` caps the context (default: max_position_embeddings).
    """
    folder = Path(folder)
    cfg = load_hf_config(folder, max_seq_len=max_seq_len)
    with torch.device("meta"):                           # no memory, no random init: every weight is loaded below
        model = GPT(cfg, attention=attention, **model_kwargs)
    state: dict[str, torch.Tensor] = {}
    for course_name, hf_name, f in checkpoint_tensors(folder):
        if not (cfg.tie_embeddings and course_name == "lm_head.weight"):    # tied: the embedding is the head
            state[course_name] = f.get_tensor(hf_name).to(dtype)
    expected = {k for k in model.state_dict() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    if missing := sorted(expected - set(state)):
        raise ValueError(f"{folder}: the weights lack {missing[:4]}{'...' if len(missing) > 4 else ''} "
                         f"({len(missing)} tensors) for this config")
    for name, p in model.state_dict().items():
        if name in state and tuple(state[name].shape) != tuple(p.shape):
            raise ValueError(f"{folder}: {name} has shape {tuple(state[name].shape)}, the config implies {tuple(p.shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    return model.to(device=device).eval()
