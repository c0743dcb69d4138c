"""Disaggregated serving (lab 11): prefill on one set of GPUs, decode on another, the KV cache moved between them.

* `transfer_cost`: the bytes of one request's KV cache (dense GQA or MLA's latent), the links they travel over
  (NVLink, InfiniBand NDR, Ethernet), the time to send them, and how much of it hides behind the prefill when the
  layers are sent one by one, or behind the first decode step.
"""
