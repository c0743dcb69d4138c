"""Teaching aids, apart from engine code: interactive views, widgets, figures and lab helpers.

The arithmetic they show (the cost rule, hardware specs, parallel costs, the serving simulator, the
speculative calculator) lives below them in `minigpt.costmodel`, which the engine folders import too.

* `plots`, `widgets` (lab 00's roofline and KV-cache calculators), `figure_view` (the widgets' figure pane).
* `profiling` (operator categories, quiet profiles), lab 01.
* `pool_view` (the paged-pool widget), lab 02.
* `serving_widget` (the goodput-versus-load widget over `costmodel.serving_simulator`), lab 03.
* `attention_traffic` (HBM bytes of naive vs flash attention), `flash_stepper` (online-softmax
  stepper widget) and `peak_memory`, lab 04.
* `quant_explorer` (weights, quantization grid, error and memory per format), lab 05.
* `goodness_of_fit` (chi-square test), `speculative_player` (round-by-round widget) and `tree_view` (a drafted token
  tree verified, round by round), lab 06.
* `parallel_planner` (the widget over `costmodel.parallel_cost`) and `pipeline_schedule`, lab 07.
* `serving_plots` (throughput and p99 TTFT against request rate), `serving_dashboard`, lab 08.
* `retrieval_view` (pass keys retrieved against depth and length, perplexity per band), lab 09.
* `grammar_stepper` (constrained decoding a token at a time: the mask, the model, the grammar's state), lab 10.
* `goodput_view` (colocated vs disaggregated goodput), lab 11.
* `timeline_view` (serial against overlapped engine steps), lab 12.
* `radix_view` (the radix tree, the pool and a host tier as a trace's requests arrive), lab 13.
* `learner_fallback` (a demo runs on the reference until the learner's exercise does).
"""
