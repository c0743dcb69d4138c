"""The course's decoding against transformers' on the same weights; writes data/vs_transformers.json.

    .venv/bin/python scripts/measure_vs_transformers.py [--prompts 4] [--new-tokens 48] [--repeats 7]

CPU (always): the course's target and draft, fp32, one thread, batch 1: lab 01's cached generation against
`generate`, lab 06's speculative decoding (k=4) against assisted generation with the same draft
(`minigpt.hf.versus_transformers`). GPU (only where CUDA is present; otherwise recorded as skipped):
a random Llama-3.2-1B-shaped model in bf16, the course's cached decoding with and without a CUDA graph
for the decode step against `generate`. Timings: interleaved, warmed up, medians (`minigpt.timing`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import torch

from minigpt.checkpoint import load_model
from minigpt.hf.versus_transformers import decode_vs_transformers
from minigpt.paths import data_dir
from minigpt.timing import compare
from minigpt.training.data import load_tokens

# Llama 3.2 1B's shape (its config.json), random weights: speed does not depend on the values.
LLAMA_1B_SHAPE = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=1024,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)


def corpus_prompts(n: int, length: int) -> list[list[int]]:
    """n windows of the validation corpus, spread over it."""
    tokens = load_tokens("val")
    step = (len(tokens) - length) // n
    return [tokens[i * step:i * step + length].tolist() for i in range(n)]


def gpu_section(new_tokens: int, repeats: int) -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine: no GPU figures were measured"}
    from transformers import LlamaConfig, LlamaForCausalLM

    from minigpt.cache.contiguous import KVCache
    from minigpt.engine.cached_generation import generate_kv_cache
    from minigpt.engine.cuda_graph import GraphedDecodeStep
    from minigpt.hf.config import config_from_hf
    from minigpt.hf.weights import hf_to_course
    from minigpt.model import GPT

    device, dtype = torch.device("cuda"), torch.bfloat16
    with torch.device(device):
        hf = LlamaForCausalLM(LlamaConfig(**LLAMA_1B_SHAPE)).to(dtype).eval()
    hf.generation_config.update(do_sample=False, eos_token_id=None, pad_token_id=0)
    cfg = config_from_hf({**hf.config.to_dict(), "model_type": "llama"})
    with torch.device(device):
        model = GPT(cfg).to(dtype).eval()
    model.load_state_dict({hf_to_course(k): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}, strict=False)
    model.lm_head.weight = model.tok_emb.weight
    prompt = torch.randint(0, cfg.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    x = torch.tensor([prompt], device=device)

    def graphed() -> list[int]:
        cache = KVCache.for_model(model, batch_size=1, max_seq_len=len(prompt) + new_tokens)
        logits = model(x, positions=cache.next_positions(len(prompt)), kv_caches=cache)[:, -1]
        step = GraphedDecodeStep(model, cache)
        out = [int(logits.argmax())]
        for pos in range(len(prompt), len(prompt) + new_tokens - 1):
            out.append(int(step(torch.tensor([[out[-1]]], device=device), pos).argmax()))
        return out

    runs = {"course cached (eager)": lambda: generate_kv_cache(model, prompt, new_tokens, stop_token_ids=()).tokens,
            "course cached + CUDA graph": graphed,
            "transformers generate": lambda: hf.generate(x, attention_mask=torch.ones_like(x),
                                                         max_new_tokens=new_tokens)[0, len(prompt):].tolist()}
    with torch.inference_mode():
        outputs = {k: fn() for k, fn in runs.items()}
        timings = compare(runs, warmup=1, repeats=repeats, device=device)
    return {"device_name": torch.cuda.get_device_name(), "model": "random Llama-3.2-1B shape, bf16",
            "tokens_per_s": {k: new_tokens / t.median for k, t in timings.items()},
            "first_tokens_agree": len({tuple(o[:8]) for o in outputs.values()}) == 1,
            "settings": {"prompt_tokens": len(prompt), "new_tokens": new_tokens, "repeats": repeats}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", type=Path, default=data_dir() / "vs_transformers.json")
    ap.add_argument("--machine-note", default="2-core x86_64 CPU, shared with other jobs while measuring")
    a = ap.parse_args()
    import transformers

    start = time.perf_counter()
    cpu = decode_vs_transformers(load_model("target"), load_model("draft"), corpus_prompts(a.prompts, a.prompt_tokens),
                                 new_tokens=a.new_tokens, k=a.k, repeats=a.repeats, threads=1)
    print("CPU, 1 thread, batch 1 (tokens/s): " + ", ".join(f"{k} {v:.1f}" for k, v in cpu["tokens_per_s"].items()))
    print(f"  cached / generate {cpu['cached_over_generate']:.2f}x; speculative / cached {cpu['speculative_over_cached']:.2f}x; "
          f"assisted / generate {cpu['assisted_over_generate']:.2f}x; tokens identical: {cpu['tokens_identical']}")
    gpu = gpu_section(a.new_tokens, a.repeats)
    print("GPU: " + (gpu["skipped"] if "skipped" in gpu else
                     ", ".join(f"{k} {v:.1f} tok/s" for k, v in gpu["tokens_per_s"].items())))
    report = {"script": "scripts/measure_vs_transformers.py", "date": datetime.date.today().isoformat(),
              "machine": {"note": a.machine_note, "processor": platform.processor() or platform.machine(),
                          "cpu_count": torch.multiprocessing.cpu_count() if hasattr(torch, "multiprocessing") else None},
              "torch": torch.__version__, "transformers": transformers.__version__,
              "cpu": cpu, "gpu": gpu, "seconds": round(time.perf_counter() - start, 1)}
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
