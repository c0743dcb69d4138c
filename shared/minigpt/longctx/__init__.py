"""Long context (lab 09): running a model past its trained length and keeping its KV cache bounded.

* `rope_scaling`: frequency transforms (position interpolation, NTK-aware, YaRN and its attention temperature).
* `long_forward`: the model's forward pass with any RoPE frequencies and attention, at any length.
* `sliding_window`: a ring-buffer KV cache with attention sinks (StreamingLLM), and the same attention as a mask.
* `kv_compression`: KV bytes per token for MHA, GQA, MQA and MLA-style latent KV.
* `mla`: multi-head latent attention: the materialised path (prefill) and the absorbed decode over the latent cache,
  and what a decode step costs each way.
* `eviction`: SnapKV-style selection of the prompt keys to keep, and its attention mask.
* `ring_attention`: the sequence split over ranks, K/V blocks passed around a ring, partials merged by LSE.
* `serving_cost`: KV bytes, prefill FLOPs and chunked-prefill time of a long request on the roofline.
"""
