"""The course's cost model: the arithmetic the engine folders and the teaching aids both build on.

* `calculators`: the cost rule (FLOPs and bytes per kernel, roofline time, KV-cache and weight bytes, model presets).
* `hardware`: accelerator specs (peak FLOP/s, HBM bandwidth and capacity) and this machine's.
* `parallel_cost`: tensor/pipeline-parallel costs (interconnects, all-reduce and pipeline time, plans), lab 07.
* `serving_simulator`: lab 03's scheduler on a roofline clock (e.g. Llama-3-8B on an H100).
* `speculative_calculator`: expected tokens per round and the cost-model speedup of speculative decoding, lab 06.

`disagg`, `longctx`, `bench` and `serving` price their work with it; `teaching`'s views, widgets and plots
show it. It never imports `minigpt.teaching`.
"""
