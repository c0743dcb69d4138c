"""Checkpoints: weights in safetensors (never pickle) plus a JSON card (config, figures, sha256).

    model = load_model("target")              # data/checkpoints/target.{safetensors,json}
    card = load_card("target")                # the card as a dict
    model = load_model("/models/SmolLM2-135M")   # a Hugging Face Llama-family folder (minigpt.hf)

Weights are stored in bfloat16 (half the bytes of float32) and cast to the requested dtype on load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.paths import data_dir

STORAGE_DTYPE = torch.bfloat16


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not match its card."""


def checkpoint_paths(name_or_path: str | Path) -> tuple[Path, Path]:
    """(weights, card) for a course model name ("target", "draft") or a path to a .safetensors file."""
    p = Path(name_or_path)
    if p.suffix != ".safetensors":
        p = data_dir() / "checkpoints" / f"{name_or_path}.safetensors"
    return p, p.with_suffix(".json")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(model: GPT, name_or_path: str | Path, card: dict[str, Any]) -> Path:
    """Write weights (bf16 safetensors, tied weights once) and the card with config, parameter count and sha256."""
    weights, card_path = checkpoint_paths(name_or_path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", STORAGE_DTYPE).contiguous() for k, v in model.state_dict().items()
             if not (model.config.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(weights))
    card = {**card, "config": model.config.to_dict(), "parameters": model.num_parameters(),
            "storage_dtype": str(STORAGE_DTYPE).removeprefix("torch."), "file": weights.name,
            "bytes": weights.stat().st_size, "sha256": sha256_file(weights)}
    card_path.write_text(json.dumps(card, indent=2) + "\n")
    return weights


def load_card(name_or_path: str | Path) -> dict[str, Any]:
    _, card_path = checkpoint_paths(name_or_path)
    if not card_path.exists():
        raise CheckpointError(f"checkpoint card {card_path} not found; restore data/ from git or run `make models`")
    try:
        return json.loads(card_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint card {card_path} is not valid JSON ({err}); restore it from git") from err


def load_model(name_or_path: str | Path = "target", *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, attention: str = "sdpa", verify: bool = True,
               max_seq_len: int | None = None, **model_kwargs: Any) -> GPT:
    """Build the model from its card, check the file's sha256, load the weights; returns it in eval mode.

    A folder with a config.json is read as a Hugging Face checkpoint instead (`minigpt.hf.load_hf_model`).
    max_seq_len: the context to build the model for (default: the checkpoint's), e.g. to cap a long one.
    """
    from minigpt.hf.loading import is_hf_folder, load_hf_model
    if is_hf_folder(name_or_path):
        return load_hf_model(name_or_path, device=device, dtype=dtype, attention=attention, max_seq_len=max_seq_len,
                             **model_kwargs)
    weights, _ = checkpoint_paths(name_or_path)
    card = load_card(name_or_path)
    if not weights.exists():
        raise CheckpointError(f"checkpoint weights {weights} not found; restore data/ from git or run `make models`")
    if verify and (actual := sha256_file(weights)) != card["sha256"]:
        raise CheckpointError(f"{weights} is corrupt or was changed: sha256 {actual[:12]}… does not match its card's "
                              f"{card['sha256'][:12]}…; restore it with `git checkout -- {weights.parent}` or retrain with `make models`")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights} is not a readable safetensors file ({err}); restore it from git or run `make models`") from err
    config = ModelConfig.from_dict(card["config"])
    if max_seq_len is not None:
        config = dataclasses.replace(config, max_seq_len=max_seq_len)
    model = GPT(config, attention=attention, **model_kwargs)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (model.config.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"{weights} does not fit its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(device=device, dtype=dtype).eval()
