"""Serving (lab 08): the engine behind an OpenAI-compatible HTTP server, with metrics, backpressure,
multi-LoRA batching, a prefix-aware router and a load generator.
"""
