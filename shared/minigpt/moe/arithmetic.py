"""DeepSeek-V3-shaped MoE arithmetic: parameters (total and activated per token) and expert-parallel traffic.

    moe_parameters(DEEPSEEK_V3)                       # (671_026_404_352, 37_552_282_624): the report's 671B / 37B
    dispatch_combine_bytes_per_token(DEEPSEEK_V3, ep_size=8)
    # DispatchCombineBytes(remote_ranks=4.59..., dispatch=32935.1, combine=65870.2): one token, one MoE layer

Sources. DeepSeek-V3 technical report (arXiv 2412.19437); the model's config.json on Hugging Face
(deepseek-ai/DeepSeek-V3) and the same shape in the official repository's inference/configs/config_671B.json
(github.com/deepseek-ai/DeepSeek-V3); its inference/model.py for what each weight is; DeepEP's README
(github.com/deepseek-ai/DeepEP) for the wire precisions.

A layer of DeepSeek-V3 is MLA attention followed by either a dense SwiGLU MLP (the first 3 layers) or an MoE
layer: a gate (E x D), E routed experts and S shared experts, all SwiGLU MLPs of width expert_d_ff
(3 * D * expert_d_ff weights each). A token runs all S shared experts and k of the E routed ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MoEShape", "DEEPSEEK_V3", "mla_attention_parameters", "expert_parameters", "moe_layer_parameters",
           "moe_parameters", "DEEPSEEK_V3_REPORTED_TOTAL", "DEEPSEEK_V3_REPORTED_ACTIVE",
           "expected_remote_ranks", "max_remote_ranks", "expected_nodes_reached", "max_nodes_reached", "DispatchCombineBytes",
           "dispatch_combine_bytes_per_token", "dispatch_combine_bytes_per_token_upper_bound"]


@dataclass(frozen=True)
class MoEShape:
    """The shape facts of a DeepSeek-V2/V3-style decoder: MLA attention, first layers dense, the rest MoE."""

    name: str
    n_layers: int              # all transformer layers (the MTP module's extra layer is not one of them)
    n_dense_layers: int        # the first layers, with a dense SwiGLU MLP instead of an MoE layer
    d_model: int
    vocab_size: int
    dense_d_ff: int            # width of the dense layers' MLP
    expert_d_ff: int           # width of each routed and each shared expert
    n_routed_experts: int
    n_shared_experts: int
    top_k: int                 # routed experts per token
    n_heads: int               # MLA: query heads
    q_lora_rank: int           # MLA: width of the compressed query (0: no query compression)
    kv_lora_rank: int          # MLA: width of the cached KV latent
    qk_nope_head_dim: int      # MLA: per-head query/key dims without RoPE
    qk_rope_head_dim: int      # MLA: per-head query/key dims with RoPE (one shared RoPE key)
    v_head_dim: int            # MLA: per-head value dims
    tie_embeddings: bool = False
    n_group: int = 1           # group-limited routing: the routed experts in n_group equal groups...
    topk_group: int = 1        # ...and a token's top_k chosen inside its best topk_group groups (1, 1: no limit)

    def __post_init__(self) -> None:
        for f in ("n_layers", "d_model", "vocab_size", "dense_d_ff", "expert_d_ff", "n_routed_experts", "top_k",
                  "n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"MoEShape.{f} must be a positive int, got {v!r}")
        for f in ("n_dense_layers", "n_shared_experts", "q_lora_rank"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"MoEShape.{f} must be a non-negative int, got {v!r}")
        if self.n_dense_layers > self.n_layers:
            raise ValueError(f"n_dense_layers={self.n_dense_layers} exceeds n_layers={self.n_layers}")
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k={self.top_k} is larger than n_routed_experts={self.n_routed_experts}")
        for f in ("n_group", "topk_group"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"MoEShape.{f} must be a positive int, got {v!r}")
        if self.topk_group > self.n_group or self.n_routed_experts % self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be at most n_group={self.n_group}, which must divide "
                             f"n_routed_experts={self.n_routed_experts}")

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers


# Every number checked against deepseek-ai/DeepSeek-V3's config.json on Hugging Face (the field after the colon),
# the same shape in inference/configs/config_671B.json of github.com/deepseek-ai/DeepSeek-V3 [its field], and, where
# it gives it, the report's section 4.2, "Model Hyper-Parameters" (arXiv 2412.19437).
DEEPSEEK_V3 = MoEShape(
    "DeepSeek-V3",
    n_layers=61,                # num_hidden_layers [n_layers]; 4.2: "the number of Transformer layers to 61"
    n_dense_layers=3,           # first_k_dense_replace [n_dense_layers]; 4.2: "all FFNs except for the first three"
    d_model=7168,               # hidden_size [dim]; 4.2: "the hidden dimension to 7168"
    vocab_size=129280,          # vocab_size [vocab_size]
    dense_d_ff=18432,           # intermediate_size [inter_dim]
    expert_d_ff=2048,           # moe_intermediate_size [moe_inter_dim]; 4.2: "hidden dimension of each expert is 2048"
    n_routed_experts=256,       # n_routed_experts [n_routed_experts]; 4.2: "256 routed experts"
    n_shared_experts=1,         # n_shared_experts [n_shared_experts]; 4.2: "1 shared expert"
    top_k=8,                    # num_experts_per_tok [n_activated_experts]; 4.2: "8 experts will be activated"
    n_heads=128,                # num_attention_heads [n_heads]; 4.2: n_h = 128
    q_lora_rank=1536,           # q_lora_rank [q_lora_rank]; 4.2: query compression dimension d_c' = 1536
    kv_lora_rank=512,           # kv_lora_rank [kv_lora_rank]; 4.2: KV compression dimension d_c = 512
    qk_nope_head_dim=128,       # qk_nope_head_dim [qk_nope_head_dim]; 4.2: per-head dimension d_h = 128
    qk_rope_head_dim=64,        # qk_rope_head_dim [qk_rope_head_dim]; 4.2: decoupled per-head dimension d_h^R = 64
    v_head_dim=128,             # v_head_dim [v_head_dim]
    tie_embeddings=False,       # tie_word_embeddings: false (inference/model.py: separate `embed` and `head`)
    n_group=8,                  # n_group [n_expert_groups]
    topk_group=4,               # topk_group [n_limited_groups]; 4.2: each token "sent to at most 4 nodes"
)

# What the report states (abstract, section 4.2 and Table 3; also the README of github.com/deepseek-ai/DeepSeek-V3):
# 671B total parameters, 37B activated for each token. The README adds that the 685B on Hugging Face are these 671B
# of the main model plus 14B of the Multi-Token Prediction (MTP) module.
DEEPSEEK_V3_REPORTED_TOTAL = 671e9
DEEPSEEK_V3_REPORTED_ACTIVE = 37e9


# ---------------------------------------------------------------- parameters

def mla_attention_parameters(shape: MoEShape) -> int:
    """Weights of one MLA attention block (DeepSeek-V3's inference/model.py, class MLA), with H heads:

        wq_a  D x q_lora_rank, q_norm q_lora_rank, wq_b q_lora_rank x H*(nope + rope)     (or wq D x H*(nope + rope))
        wkv_a D x (kv_lora_rank + rope), kv_norm kv_lora_rank, wkv_b kv_lora_rank x H*(nope + v)
        wo    H*v x D
    """
    d, h = shape.d_model, shape.n_heads
    qk_head_dim = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    if shape.q_lora_rank:
        query = d * shape.q_lora_rank + shape.q_lora_rank + shape.q_lora_rank * h * qk_head_dim
    else:
        query = d * h * qk_head_dim
    key_value = (d * (shape.kv_lora_rank + shape.qk_rope_head_dim) + shape.kv_lora_rank
                 + shape.kv_lora_rank * h * (shape.qk_nope_head_dim + shape.v_head_dim))
    return query + key_value + h * shape.v_head_dim * d


def expert_parameters(shape: MoEShape) -> int:
    """One routed or shared expert, a SwiGLU MLP: 3 * d_model * expert_d_ff (gate, up and down projections)."""
    return 3 * shape.d_model * shape.expert_d_ff


def moe_layer_parameters(shape: MoEShape) -> tuple[int, int]:
    """(total, activated per token) weights of one MoE layer's MLP part.

    total  = (E + S) * expert + E * D      (the gate's E x D matrix)
    active = (k + S) * expert + E * D      (every token scores all E experts, runs k of them and the S shared)
    """
    gate = shape.n_routed_experts * shape.d_model
    expert = expert_parameters(shape)
    return ((shape.n_routed_experts + shape.n_shared_experts) * expert + gate,
            (shape.top_k + shape.n_shared_experts) * expert + gate)


def moe_parameters(shape: MoEShape) -> tuple[int, int]:
    """(total, activated per token) parameters of the main model, computed from the shape.

    total = embedding V*D + output head V*D (once if tied) + final norm D
            + n_layers * (MLA attention + 2 RMSNorm weights of D)
            + n_dense_layers * 3 * D * dense_d_ff + n_moe_layers * moe_layer_total
    active = the same with each MoE layer's activated part: only the k routed experts a token runs are counted
             (the embedding table stays in, as it does in the total; it is a lookup, one row per token).

    For DeepSeek-V3: 671,026,404,352 total (report: 671B) and 37,552,282,624 activated (report: 37B; without the
    input embedding's 0.93B it would be 36.6B: the report does not say which convention it rounds, both are within
    2%). Left out: the MTP module (14B more, one extra layer plus its projection, per the README), the gate's
    load-balancing bias (e_score_correction_bias, E floats per MoE layer: 14,848 in all) and the FP8 checkpoint's
    scale tensors.
    """
    d = shape.d_model
    embeddings = shape.vocab_size * d * (1 if shape.tie_embeddings else 2)
    per_layer_common = mla_attention_parameters(shape) + 2 * d
    dense_mlps = shape.n_dense_layers * 3 * d * shape.dense_d_ff
    moe_total, moe_active = moe_layer_parameters(shape)
    common = embeddings + d + shape.n_layers * per_layer_common + dense_mlps
    return common + shape.n_moe_layers * moe_total, common + shape.n_moe_layers * moe_active


# ---------------------------------------------------------------- expert-parallel traffic

def _check_ep(ep_size: int, top_k: int) -> None:
    for name, v in (("ep_size", ep_size), ("top_k", top_k)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def expected_remote_ranks(ep_size: int, top_k: int) -> float:
    """Expected number of OTHER ranks a token's k experts live on, under uniform routing.

    Assumptions: experts spread evenly over the ep ranks (E / ep each), and each of the k choices lands on a rank
    uniformly and independently. A given rank then receives none of them with probability (1 - 1/ep)^k, so the
    expected number of distinct ranks hit is ep * (1 - (1 - 1/ep)^k); the token's own rank is hit with the same
    probability and costs no traffic, which leaves

        (ep - 1) * (1 - (1 - 1/ep)^k)

    remote ranks. The k experts are in fact distinct (drawn without replacement), which spreads them slightly
    more: exactly (ep - 1) * (1 - C(E - E/ep, k) / C(E, k)); for DeepSeek-V3 (E = 256, k = 8) that is 0.8%, 1.2%
    and 1.4% above this figure at ep = 8, 32 and 256 (at ep = E it is k * (ep - 1) / ep). Real routing is not
    uniform, and DeepSeek-V3's group-limited routing (n_group 8, topk_group 4 in its config) keeps a token's
    experts within 4 of 8 expert groups, which caps the distinct ranks when groups are aligned with ranks.
    """
    _check_ep(ep_size, top_k)
    return (ep_size - 1) * (1 - (1 - 1 / ep_size) ** top_k)


def max_remote_ranks(ep_size: int, top_k: int) -> int:
    """The upper bound: min(k, ep - 1) remote ranks, every expert on a different rank, none on the token's own.

    At ep > k this is the naive dispatch that sends one copy of the token per chosen expert (k copies).
    """
    _check_ep(ep_size, top_k)
    return min(top_k, ep_size - 1)


def expected_nodes_reached(shape: MoEShape, n_nodes: int) -> float:
    """Expected number of distinct nodes (the token's own included) a token's k distinct experts live on, routing
    uniform and unlimited, the E experts spread evenly over the n nodes: a node holds none of them with probability
    C(E - E/n, k) / C(E, k), so n * (1 - C(E - E/n, k) / C(E, k)) (8 nodes, DeepSeek-V3: 5.29 of 8)."""
    _check_ep(n_nodes, shape.top_k)
    e, k = shape.n_routed_experts, shape.top_k
    if e % n_nodes:
        raise ValueError(f"{n_nodes} nodes do not divide n_routed_experts={e} evenly")
    return n_nodes * (1 - math.comb(e - e // n_nodes, k) / math.comb(e, k))


def max_nodes_reached(shape: MoEShape, n_nodes: int) -> int:
    """The most nodes one token's experts can live on. With one expert group a node (n_nodes == shape.n_group),
    group-limited routing keeps them within topk_group nodes: min(k, topk_group); otherwise min(k, n_nodes)."""
    _check_ep(n_nodes, shape.top_k)
    limit = shape.topk_group if n_nodes == shape.n_group else n_nodes
    return min(shape.top_k, limit, n_nodes)


@dataclass(frozen=True)
class DispatchCombineBytes:
    """One token's traffic to other ranks in ONE MoE layer, in bytes."""

    remote_ranks: float        # copies of the token that leave its rank
    dispatch: float            # its hidden vector to each remote rank holding one of its experts
    combine: float             # each remote rank's partial result back (one vector per rank, summed there)

    @property
    def total(self) -> float:
        return self.dispatch + self.combine


def _bytes(shape: MoEShape, ep_size: int, remote_ranks: float, dispatch_bytes_per_element: float,
           combine_bytes_per_element: float) -> DispatchCombineBytes:
    if shape.n_routed_experts % ep_size:
        raise ValueError(f"ep_size={ep_size} does not divide n_routed_experts={shape.n_routed_experts}: the experts "
                         "would not spread evenly over the ranks")
    for name, v in (("dispatch_bytes_per_element", dispatch_bytes_per_element),
                    ("combine_bytes_per_element", combine_bytes_per_element)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
    return DispatchCombineBytes(remote_ranks, remote_ranks * shape.d_model * dispatch_bytes_per_element,
                                remote_ranks * shape.d_model * combine_bytes_per_element)


def dispatch_combine_bytes_per_token(shape: MoEShape, ep_size: int, dispatch_bytes_per_element: float = 1,
                                     combine_bytes_per_element: float = 2) -> DispatchCombineBytes:
    """Expected bytes one token sends to other ranks in one MoE layer, under uniform routing.

    dispatch = expected_remote_ranks(ep, k) * d_model * dispatch_bytes_per_element
    combine  = expected_remote_ranks(ep, k) * d_model * combine_bytes_per_element

    A rank holding several of the token's experts receives the token once and returns one summed vector (DeepEP's
    normal kernels deduplicate this way; its low-latency kernels send a copy per expert: the upper bound below).
    The defaults are DeepEP's DeepSeek-V3 setting, "FP8 dispatching and BF16 combining"
    (its README); the FP8 scales that travel with the vector (one per 128 elements in DeepSeek-V3) are left out,
    and so are the shared expert (every rank holds a copy: no traffic) and the routing metadata.
    """
    remote = expected_remote_ranks(ep_size, shape.top_k)
    return _bytes(shape, ep_size, remote, dispatch_bytes_per_element, combine_bytes_per_element)


def dispatch_combine_bytes_per_token_upper_bound(shape: MoEShape, ep_size: int, dispatch_bytes_per_element: float = 1,
                                                 combine_bytes_per_element: float = 2) -> DispatchCombineBytes:
    """The same bytes with max_remote_ranks(ep, k) = min(k, ep - 1) copies: every chosen expert on its own remote
    rank. It is the most a token can cost, and what a dispatch that does not deduplicate per rank pays."""
    remote = max_remote_ranks(ep_size, shape.top_k)
    return _bytes(shape, ep_size, remote, dispatch_bytes_per_element, combine_bytes_per_element)
