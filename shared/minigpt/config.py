"""Model shape: one frozen dataclass, saved in every checkpoint card."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency rescaling (HF `rope_type: "llama3"`), for contexts past the pretraining one.

    With wavelength w_i = 2*pi / inv_freq_i and the pretraining context L = original_max_position_embeddings:
    w_i < L / high_freq_factor keeps inv_freq_i; w_i > L / low_freq_factor divides it by `factor`; in between,
    inv_freq_i is blended linearly in s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor):
    (1 - s) * inv_freq_i / factor + s * inv_freq_i.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if not (self.factor > 0 and 0 < self.low_freq_factor < self.high_freq_factor
                and self.original_max_position_embeddings > 0):
            raise ValueError(f"llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                             f"original_max_position_embeddings > 0, got {self}")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, SwiGLU MLP, grouped-query attention.

    n_kv_heads == n_heads is multi-head attention (MHA), n_kv_heads == 1 is multi-query (MQA),
    anything between that divides n_heads is grouped-query (GQA): query head h reads KV head
    h // (n_heads // n_kv_heads).
    """

    vocab_size: int = 4096
    max_seq_len: int = 512
    d_model: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2
    d_ff: int = 1024
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):          # from a JSON card
            object.__setattr__(self, "rope_scaling", Llama3RopeScaling(**self.rope_scaling))
        for name in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads} (GQA groups must be equal)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}")
        return cls(**d)


# The two course models (trained by `make models`, shipped in data/checkpoints/).
TARGET_CONFIG = ModelConfig(d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024)
DRAFT_CONFIG = ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=384)
