"""Teaching aids, apart from engine code: facts, arithmetic, figures, interactive views and simulators.

* `hardware` (accelerator facts), `calculators` (roofline and KV-cache arithmetic), `plots`, `widgets`
  (lab 00's calculators).
* `pool_view` (the paged-pool widget), lab 02.
* `serving_simulator` (lab 03's scheduler on a roofline clock, e.g. Llama-3-8B on an H100) and
  `serving_widget` (its goodput-versus-load widget), lab 03.
* `attention_traffic` (HBM bytes of naive vs flash attention) and `flash_stepper` (online-softmax
  stepper widget), lab 04.
* `quant_explorer` (weights, quantization grid, error and memory per format), lab 05.
* `speculative_calculator` (expected tokens per round, cost-model speedup), `goodness_of_fit`
  (chi-square test) and `speculative_player` (round-by-round widget), lab 06.
* `parallel_cost` (tensor/pipeline-parallel cost model) and `parallel_planner` (its widget), lab 07.
* `serving_plots` (throughput and p99 TTFT against request rate), lab 08.
* `retrieval_view` (pass keys retrieved against depth and length, perplexity per band), lab 09.
* `grammar_stepper` (constrained decoding a token at a time: the mask, the model, the grammar's state), lab 10.
"""
