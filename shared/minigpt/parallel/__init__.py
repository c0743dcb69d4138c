"""Parallelism (lab 07): Megatron-style tensor-parallel linears, sharded checkpoint loading and a
sharded KV cache, run as real ranks on torch.distributed (gloo on CPU, NCCL on GPU).
"""
