"""Tensor-parallel generation as a torchrun program (gloo on CPU, NCCL on GPU).

    torchrun --nproc-per-node 2 -m minigpt.parallel.generate_tp --max-new-tokens 16 --out result.json

Every rank loads its slices of the checkpoint, builds a sharded KV cache and runs lab 01's cached
generation; rank 0 also runs the one-process model and writes a JSON report: the tokens of both, the
largest logit difference (prefill and one decode step), the collectives of one decode step, wall time.
`--plan-tp N` refuses a world of another size; `--fail-rank R` makes rank R crash (to test the error path).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from minigpt.checkpoint import load_model
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.launch import init_from_env
from minigpt.parallel.tp_model import load_tp_model, tp_kv_cache
from minigpt.tokenizer import tokenizer_for

DEFAULT_PROMPT = "Once upon a time"


def tp_report(comm: CountingComm, model_name: str, prompt: str, max_new_tokens: int, *, vocab_parallel: bool = True,
              plan_tp: int | None = None, compare: bool = True) -> dict:
    """Run on every rank; the returned report is meaningful on rank 0 (the others return the same tokens)."""
    device = _rank_device()
    model = load_tp_model(model_name, comm, vocab_parallel=vocab_parallel, expected_world_size=plan_tp, device=device)
    cfg, tp, rank = model.config, comm.world_size, comm.rank
    ids = tokenizer_for(model_name).encode(prompt)
    with torch.inference_mode():
        cache = tp_kv_cache(cfg, tp, rank, max_seq_len=len(ids) + 1, device=device)
        tokens = torch.tensor([ids], device=device)
        prefill = model(tokens, positions=cache.next_positions(len(ids)), kv_caches=cache)
        nxt = prefill[:, -1:].argmax(-1)
        comm.stats.reset()
        decode = model(nxt, positions=cache.next_positions(1), kv_caches=cache)
        per_token = comm.stats.as_dict()
        start = time.perf_counter()
        out = generate_kv_cache(model, ids, max_new_tokens,
                                cache=tp_kv_cache(cfg, tp, rank, max_seq_len=len(ids) + max_new_tokens, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    report = {"world_size": tp, "rank": rank, "backend": dist.get_backend() if dist.is_initialized() else "threads",
              "tokens": out.tokens, "seconds": seconds, "collectives_per_decode_token": per_token,
              "kv_cache_heads_per_rank": cache[0].n_kv_heads}
    if compare and rank == 0:
        full = load_model(model_name, device=device)
        with torch.inference_mode():
            ref_prefill = full(tokens)
            ref_decode = full(torch.cat([tokens, nxt], 1))[:, -1:]
            start = time.perf_counter()
            ref = generate_kv_cache(full, ids, max_new_tokens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            report["one_process_seconds"] = time.perf_counter() - start
        report["one_process_tokens"] = ref.tokens
        report["max_logit_diff_prefill"] = float((prefill - ref_prefill).abs().max())
        report["max_logit_diff_decode"] = float((decode - ref_decode).abs().max())
    return report


def _rank_device() -> torch.device:
    """NCCL ranks compute on their own GPU (cuda:LOCAL_RANK); gloo ranks on the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@record
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="target")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--no-vocab-parallel", action="store_true")
    ap.add_argument("--plan-tp", type=int, default=None)
    ap.add_argument("--fail-rank", type=int, default=None)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default=None, help="default: nccl with GPUs, else gloo")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    comm = init_from_env(a.backend, timeout_s=a.timeout_s)
    try:
        if a.fail_rank == comm.rank:
            raise RuntimeError(f"rank {comm.rank} crashed on purpose (--fail-rank {a.fail_rank})")
        report = tp_report(comm, a.model, a.prompt, a.max_new_tokens, vocab_parallel=not a.no_vocab_parallel,
                           plan_tp=a.plan_tp)
        if comm.rank == 0:
            a.out.write_text(json.dumps(report, indent=1))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
