"""Parallelism (lab 07): Megatron-style tensor parallelism run as real ranks on torch.distributed.

* `sharding`: pure functions giving each rank's slice of every weight (heads kept whole, KV heads
  replicated when tp > n_kv_heads, norms replicated).
* `comm`: collectives that count their calls and bytes (torch.distributed or threads as backends).
* `linears`: column- and row-parallel linears for the model's `make_linear` factory.
* `vocab_parallel`: embedding and LM head split over the vocabulary (all-reduce in, all-gather out).
* `loading`: each rank reads only its slices of the safetensors checkpoint.
* `tp_model`: one rank's model and its sharded KV cache.
* `launch`: start N ranks (forked gloo processes, threads, or torchrun) with timeouts; failures name the rank.
* `generate_tp`: `torchrun --nproc-per-node 2 -m minigpt.parallel.generate_tp --out r.json`.
"""
