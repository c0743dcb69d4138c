"""A Hugging Face `config.json` of the Llama family as a course `ModelConfig`, and back.

    cfg = config_from_hf(json.loads(Path(d, "config.json").read_text()))    # UnsupportedModel if it is not one
    hf = config_to_hf(cfg)                                                   # dict for config.json (LlamaForCausalLM)

Accepted: `model_type` "llama" or "mistral" (Llama 1/2/3/3.1/3.2, TinyLlama, SmolLM, SmolLM2, Mistral 7B v0.2+):
bias-free projections, SiLU-gated MLP, RMSNorm, RoPE ("default" or Llama 3.1's "llama3" frequency scaling),
grouped-query attention, tied or untied output head, head_dim = hidden_size / num_attention_heads.
Everything else is refused with `UnsupportedModel` naming the field, so no model silently computes
something else. Both spellings of RoPE settings are read: `rope_theta` + `rope_scaling` (transformers 4,
what most checkpoints ship) and `rope_parameters` (transformers 5).
"""

from __future__ import annotations

from typing import Any

from minigpt.config import Llama3RopeScaling, ModelConfig

__all__ = ["UnsupportedModel", "SUPPORTED_MODEL_TYPES", "config_from_hf", "config_to_hf", "eos_ids_from"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
# Fields whose mere presence (with a truthy value) means a mixture-of-experts model.
MOE_FIELDS = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts", "moe_intermediate_size")


class UnsupportedModel(ValueError):
    """The checkpoint's config asks for something the course model does not compute (the message names the field)."""


def _refuse(field: str, value: Any, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"config.json: {field}={value!r} is not supported: {why}")


def _rope(d: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, llama3 scaling or None) from either rope spelling."""
    params = d.get("rope_parameters")
    field = "rope_parameters" if params is not None else "rope_scaling"
    if params is None:
        params = d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10_000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return theta, None
    if rope_type != "llama3":
        raise _refuse(f"{field}.rope_type", rope_type, "only the plain RoPE ('default') and Llama 3.1's 'llama3' "
                      "frequency scaling are implemented (not linear, dynamic, yarn, longrope...)")
    try:
        scaling = Llama3RopeScaling(float(params["factor"]), float(params["low_freq_factor"]),
                                    float(params["high_freq_factor"]), int(params["original_max_position_embeddings"]))
    except KeyError as err:
        raise UnsupportedModel(f"config.json: {field} of type 'llama3' lacks {err.args[0]!r}") from None
    return theta, scaling


def config_from_hf(d: dict[str, Any], *, max_seq_len: int | None = None) -> ModelConfig:
    """The course config of a Llama-family HF config dict; UnsupportedModel naming the first unsupported field.

    max_seq_len: the context to allocate for (default: `max_position_embeddings`); lower it for models with
    long contexts, since contiguous KV caches are sized by it.
    """
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _refuse("model_type", model_type, f"the course model is a Llama; supported: {list(SUPPORTED_MODEL_TYPES)}")
    for arch in d.get("architectures") or []:
        if arch not in SUPPORTED_ARCHITECTURES:
            raise _refuse("architectures", d["architectures"], f"supported: {list(SUPPORTED_ARCHITECTURES)}")
    if d.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", d["hidden_act"], "the MLP is SwiGLU (silu gate)")
    for field in ("attention_bias", "mlp_bias"):
        if d.get(field):
            raise _refuse(field, d[field], "the course's projections have no bias")
    if d.get("sliding_window") is not None or d.get("use_sliding_window"):
        raise _refuse("sliding_window", d.get("sliding_window"), "every layer attends to the whole context "
                      "(Mistral v0.2 and later set it to null)")
    for field in MOE_FIELDS:
        if d.get(field):
            raise _refuse(field, d[field], "mixture-of-experts layers are not implemented")
    if d.get("quantization_config"):
        raise _refuse("quantization_config", d["quantization_config"].get("quant_method", "..."),
                      "pre-quantized checkpoints are not read; load the bf16/fp16 weights (lab 05 quantizes them)")
    hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
    head_dim = d.get("head_dim")
    if head_dim is not None and hidden % heads == 0 and int(head_dim) != hidden // heads:
        raise _refuse("head_dim", head_dim, f"the course model uses hidden_size / num_attention_heads = {hidden // heads}")
    theta, scaling = _rope(d)
    context = int(d.get("max_position_embeddings", 2048))
    try:
        return ModelConfig(vocab_size=int(d["vocab_size"]), max_seq_len=max_seq_len or context, d_model=hidden,
                           n_layers=int(d["num_hidden_layers"]), n_heads=heads,
                           n_kv_heads=int(d.get("num_key_value_heads") or heads), d_ff=int(d["intermediate_size"]),
                           rope_theta=theta, norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                           tie_embeddings=bool(d.get("tie_word_embeddings", False)), rope_scaling=scaling)
    except KeyError as err:
        raise UnsupportedModel(f"config.json lacks the field {err.args[0]!r}") from None
    except ValueError as err:
        raise UnsupportedModel(f"config.json does not describe a valid model: {err}") from None


def config_to_hf(cfg: ModelConfig, *, eos_token_id: int, bos_token_id: int | None = None,
                 dtype: str = "bfloat16") -> dict[str, Any]:
    """config.json of a `LlamaForCausalLM` computing exactly `cfg` (transformers 4 spelling, read by 4, 5, vLLM, llama.cpp)."""
    scaling = None
    if cfg.rope_scaling is not None:
        scaling = {"rope_type": "llama3", **cfg.rope_scaling.__dict__}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "rope_scaling": scaling, "attention_bias": False, "mlp_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id, "pretraining_tp": 1, "torch_dtype": dtype, "use_cache": True}


def eos_ids_from(*configs: dict[str, Any]) -> tuple[int, ...]:
    """Every `eos_token_id` (an int or a list) of config.json and generation_config.json, in order, once each."""
    ids: list[int] = []
    for c in configs:
        value = c.get("eos_token_id")
        for t in value if isinstance(value, list) else [] if value is None else [value]:
            if int(t) not in ids:
                ids.append(int(t))
    return tuple(ids)
