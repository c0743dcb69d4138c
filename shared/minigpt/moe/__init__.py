"""Mixture of experts (lab 11): a routed MLP layer, its token dispatch, and the arithmetic of expert parallelism.

* `layer`: the top-k softmax `Router`, the `Expert` (the course model's SwiGLU MLP), `MoELayer` (tokens grouped
  per expert, optional DeepSeek-style shared experts) and `dense_reference`, the every-expert-on-every-token
  oracle; `dispatch` / `combine` with a per-expert capacity (GShard/Switch token dropping), `capacity_for`,
  `expert_load` and `rank_load` (tokens per expert and per rank of a placement).
* `arithmetic`: DeepSeek-V3-shaped counts: total and activated parameters, and the bytes one token sends to
  other ranks in an MoE layer's dispatch and combine at a given expert-parallel size.
* `expert_parallel`: `moe_forward` (one process) and `ep_moe_forward` (one rank of expert parallelism: dispatch
  and combine as all-to-alls), `ep_bytes_per_layer` (the bytes those all-to-alls move).
* `eplb`: `eplb_placement` (DeepSeek's EPLB: replicate the hot experts, pack replicas by load), `replica_counts`,
  `rank_loads`, and `zipf_routing` (skewed synthetic routing).
* `course_model`: the trained target cut into experts (MoEfication) with trained routers, `load_course_moe` and
  `routing_statistics` (real per-layer expert loads); `python -m minigpt.moe.course_model` retrains the routers.
"""

from minigpt.moe.course_model import load_course_moe, routing_statistics
from minigpt.moe.eplb import eplb_placement, rank_loads, replica_counts, zipf_routing
from minigpt.moe.expert_parallel import EPBytes, ep_bytes_per_layer, ep_moe_forward, moe_forward

__all__ = ["moe_forward", "ep_moe_forward", "EPBytes", "ep_bytes_per_layer", "eplb_placement", "replica_counts",
           "rank_loads", "zipf_routing", "load_course_moe", "routing_statistics"]
