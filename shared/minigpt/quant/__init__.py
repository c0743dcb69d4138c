"""Quantization (lab 05): integer and FP8 formats, weight-only linears, GPTQ, AWQ, SmoothQuant and
KV-cache quantization, plugged into the model through its linear factory.
"""
