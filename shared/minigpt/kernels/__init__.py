"""Triton kernels: FlashAttention forward and split-KV paged decode (lab 04), the dequantizing
GEMV (lab 05). On a machine without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1).

* dequant_gemv.py: fused dequantizing INT8 / INT4 GEMV with group scales (lab 05)
"""
