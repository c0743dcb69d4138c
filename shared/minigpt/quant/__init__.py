"""Quantization (lab 05): integer and FP8 formats, weight-only linears, GPTQ, AWQ, SmoothQuant and
KV-cache quantization, plugged into the model through its linear factory.

* formats.py: symmetric/asymmetric INT quantization (per tensor, channel, group), INT4 packing, FP8 with scales
* linear.py: WeightOnlyLinear (W8A16, W4A16), FP8WeightLinear, quantize_linears via make_linear
* calibration.py: seeded training-split windows and the inputs each projection sees
* gptq.py, awq.py, smoothquant.py: the three calibrated methods (W4A16, W4A16, W8A8)
* kv_cache.py: INT8 / FP8 KV cache with per-token, per-head scales (lab 01's cache protocol)
* cpu_kernels.py: PyTorch's CPU kernels for INT8 (oneDNN) and INT4 (_weight_int4pack_mm_for_cpu) products
* quality.py: perplexity on a seeded validation subset, with an optional quantized KV cache
"""
