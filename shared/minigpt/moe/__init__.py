"""Mixture of experts (lab 11): a routed MLP layer, its token dispatch, and the arithmetic of expert parallelism.

* `layer`: the top-k softmax `Router`, the `Expert` (the course model's SwiGLU MLP), `MoELayer` (tokens grouped
  per expert, optional DeepSeek-style shared experts) and `dense_reference`, the every-expert-on-every-token
  oracle; `dispatch` / `combine` with a per-expert capacity (GShard/Switch token dropping), `capacity_for`,
  `expert_load` and `rank_load` (tokens per expert and per rank of a placement).
* `arithmetic`: DeepSeek-V3-shaped counts: total and activated parameters, and the bytes one token sends to
  other ranks in an MoE layer's dispatch and combine at a given expert-parallel size.
"""
