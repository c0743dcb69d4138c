"""Hugging Face Llama weight names <-> the course's `GPT` state_dict names, and reading a checkpoint folder.

    hf_to_course("model.layers.3.self_attn.q_proj.weight")   # "layers.3.attn.wq.weight"
    for course_name, hf_name, path in checkpoint_tensors(folder): ...   # every tensor, over one or many shards

No tensor needs reshaping or permuting: the course's `apply_rope` rotates the halves (x[i], x[i + D/2]) of
each head like transformers' `rotate_half`, and query head h reads KV head h // (n_heads / n_kv_heads)
in both, so every weight is copied as it is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

__all__ = ["hf_to_course", "course_to_hf", "checkpoint_files", "checkpoint_tensors", "IGNORED"]

_LAYER = {"self_attn.q_proj": "attn.wq", "self_attn.k_proj": "attn.wk", "self_attn.v_proj": "attn.wv",
          "self_attn.o_proj": "attn.wo", "mlp.gate_proj": "mlp.w_gate", "mlp.up_proj": "mlp.w_up",
          "mlp.down_proj": "mlp.w_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}
_TOP = {"model.embed_tokens.weight": "tok_emb.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight"}
# Buffers some older checkpoints saved; recomputed from the config, so skipped.
IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")


def hf_to_course(name: str) -> str:
    """The course name of an HF Llama tensor; KeyError for a tensor the course model has no place for."""
    if name in _TOP:
        return _TOP[name]
    m = _LAYER_NAME.fullmatch(name)
    if m and m.group(2) in _LAYER:
        return f"layers.{m.group(1)}.{_LAYER[m.group(2)]}.weight"
    raise KeyError(f"tensor {name!r} has no counterpart in the course model (a bias, an expert, an adapter?)")


def course_to_hf(name: str) -> str:
    """The HF Llama name of a course `GPT` state_dict key."""
    for hf, course in _TOP.items():
        if name == course:
            return hf
    layer, _, rest = name.removeprefix("layers.").partition(".")
    module = rest.removesuffix(".weight")
    for hf, course in _LAYER.items():
        if course == module:
            return f"model.layers.{layer}.{hf}.weight"
    raise KeyError(f"no HF name for course parameter {name!r}")


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of an HF folder: those its model.safetensors.index.json names, or model.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in folder.glob("*.bin"))
        hint = f" (found {bins[:3]}: pickled weights are not read; convert them to safetensors)" if bins else ""
        raise FileNotFoundError(f"{folder} has no *.safetensors weights{hint}")
    if missing := [f.name for f in files if not f.exists()]:
        raise FileNotFoundError(f"{folder}: model.safetensors.index.json names {missing} but they are not there")
    return files


def checkpoint_tensors(folder: Path) -> Iterator[tuple[str, str, Any]]:
    """(course name, HF name, open safetensors file) of every tensor of the folder, skipping IGNORED buffers.
    Read it with `f.get_tensor(hf_name)` or a piece with `f.get_slice(hf_name)[rows, cols]` (lazily mapped)."""
    from safetensors import safe_open

    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if not IGNORED.fullmatch(name):
                    yield hf_to_course(name), name, f
