"""Decode speed of the course's target against `transformers` on the same weights, and where it sits on the roofline.

Time per token is a slope: each candidate generates `short` and then `long` new tokens from the same prompt, both
timed in one interleaved `compare`, and

    seconds per token = (median(long) - median(short)) / (long - short)

so the prompt's prefill, the set-up and anything else paid once per call cancel out. Bytes per token follow lab 00's
rule (`minigpt.costmodel.calculators.decode_kernels`, float32: every weight once, the tied embedding's whole matrix by
the LM head, plus the K/V read at the mean context of the timed tokens), and

    MBU = bytes per token / seconds per token / the copy bandwidth measured in the same run.

Candidates at batch 1 (greedy, no stop token, one thread): the model step alone (lab 01's loop without sampling or
stop rules), lab 01's `generate_kv_cache`, lab 01's loop on the engine-style fused model
(`minigpt.engine.fused_decode`), the serving engine (lab 08's `LLMEngine`, one request) on the model as written and
on its fused weights, and `transformers`' `generate` eager (its dynamic cache) and with its static cache compiled
(`torch.compile`, inductor). At batch 8 and 32 the model step's FLOP/s (lab 00's FLOPs per step / seconds per step)
against the measured matmul peak.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from minigpt.cache.contiguous import KVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.fused_decode import FusedModel, generate_fused
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.costmodel.calculators import ModelShape, decode_kernels
from minigpt.timing import compare

__all__ = ["BATCH1", "decode_runs", "matmul_passes", "model_steps", "profile_steps", "per_token_seconds", "step_cost", "transformers_peer"]

BATCH1 = ("model step", "lab 01 generate_kv_cache", "fused decode step", "serving engine (model as written)",
          "serving engine", "transformers generate (eager)", "transformers generate (static cache, compiled)")
Runner = Callable[[int], Any]          # generate this many new tokens


@torch.inference_mode()
def model_steps(model: GPT, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decode of a batch (B, P) with a contiguous cache: one prefill, then `new_tokens` one-token steps."""
    B, P = prompts.shape
    cache = KVCache.for_model(model, batch_size=B, max_seq_len=P + new_tokens + 1)
    logits = model(prompts, positions=cache.next_positions(P), kv_caches=cache)[:, -1]
    for _ in range(new_tokens):
        token = logits.argmax(-1, keepdim=True)
        logits = model(token, positions=cache.next_positions(1), kv_caches=cache)[:, -1]
    return logits


def transformers_peer(model: GPT) -> Any:
    """The course model as a `transformers` LlamaForCausalLM (same weights), greedy, exactly max_new_tokens."""
    from minigpt.hf.export import to_transformers

    hf = to_transformers(model)
    hf.generation_config.update(do_sample=False, eos_token_id=None, pad_token_id=0)
    return hf


def _engine_run(model: GPT, prompt: list[int], new_tokens: int, *, fused: bool = True) -> None:
    from minigpt.serving.engine import EngineConfig, LLMEngine

    blocks = (len(prompt) + new_tokens) // 16 + 2
    engine = LLMEngine(model, EngineConfig(num_blocks=blocks, max_num_seqs=1, enable_prefix_caching=False,
                                           fused_weights=fused))
    engine.add_request("bench", prompt, max_tokens=new_tokens, sampling=SamplingParams())
    while engine.has_unfinished():
        engine.step()


def decode_runs(model: GPT, prompt: Sequence[int], longest: int, names: Sequence[str] = BATCH1) -> dict[str, Runner]:
    """For each candidate, a function that generates n new tokens (greedy) from `prompt`, batch 1."""
    ids = list(prompt)
    x = torch.tensor([ids])
    hf = transformers_peer(model) if any(n.startswith("transformers") for n in names) else None
    fused = FusedModel(model) if "fused decode step" in names else None

    def hf_generate(n: int, **kw: Any) -> Any:
        with torch.inference_mode():
            return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, **kw)

    def hf_static(n: int) -> Any:
        from transformers import CompileConfig

        compiled = CompileConfig()
        compiled._compile_all_devices = True           # transformers compiles on GPUs only unless told otherwise
        # one static cache length for every n: one compiled graph, as a server would keep
        return hf_generate(n, cache_implementation="static", compile_config=compiled,
                           cache_config={"max_cache_len": len(ids) + longest + 1})

    every: dict[str, Runner] = {
        "model step": lambda n: model_steps(model, x, n),
        "lab 01 generate_kv_cache": lambda n: generate_kv_cache(model, ids, n, stop_token_ids=()),
        "fused decode step": lambda n: generate_fused(model, ids, n, fused=fused),
        "serving engine (model as written)": lambda n: _engine_run(model, ids, n, fused=False),
        "serving engine": lambda n: _engine_run(model, ids, n),
        "transformers generate (eager)": lambda n: hf_generate(n),
        "transformers generate (static cache, compiled)": hf_static,
    }
    if unknown := set(names) - set(every):
        raise ValueError(f"unknown candidates {sorted(unknown)}; choose from {sorted(every)}")
    return {name: every[name] for name in names}


def per_token_seconds(runs: dict[str, Runner], short: int, long: int, *, repeats: int, threads: int = 1,
                      warmup: int = 1) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """Seconds per generated token of each run (the slope between `short` and `long` tokens), and the raw samples."""
    if not 0 < short < long:
        raise ValueError(f"need 0 < short < long, got short={short}, long={long}")
    candidates = {f"{name} @{n}": (lambda fn=fn, n=n: fn(n)) for name, fn in runs.items() for n in (short, long)}
    timings = compare(candidates, warmup=warmup, repeats=repeats, threads=threads)
    slopes = {name: (timings[f"{name} @{long}"].median - timings[f"{name} @{short}"].median) / (long - short)
              for name in runs}
    raw = {name: {str(n): timings[f"{name} @{n}"].samples for n in (short, long)} for name in runs}
    return slopes, raw


def step_cost(model: GPT, context: float, batch: int = 1) -> tuple[float, float]:
    """(FLOPs, bytes) of one float32 decode step of `batch` sequences at `context` cached tokens, by lab 00's rule."""
    shape = ModelShape.from_config(model.config, "course target")
    kernels = decode_kernels(shape, round(context), batch, weight_bytes_per_element=4, kv_bytes_per_element=4)
    return float(sum(f for f, _ in kernels.values())), float(sum(b for _, b in kernels.values()))


def matmul_passes(model: GPT) -> dict[str, Callable[[], Any]]:
    """A decode step's weight matmuls alone, one row each, in order (the floor under any step that reads its weights
    through the BLAS): nn.Linear's 43 (out, in) weights, and the fused step's 25 K-major ones."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    fused = FusedModel(model)
    k_major = [w for layer in zip(fused.qkv, fused.wo, fused.gate_up, fused.down) for w in layer] + [fused.head]
    rows = {n: torch.randn(1, n) for n in {m.in_features for m in linears}}

    def nn_linear() -> None:
        for m in linears:
            m(rows[m.in_features])

    def fused_k_major() -> None:
        for w in k_major:
            rows[w.shape[0]] @ w
    return {"matmuls alone: nn.Linear (out, in), 43": nn_linear, "matmuls alone: fused K-major, 25": fused_k_major}


@torch.inference_mode()
def profile_steps(model: GPT, prompt: Sequence[int], steps: int = 20) -> dict[str, dict[str, Any]]:
    """Where a decode step's time goes (torch.profiler, CPU): for the model step and the fused step, aten operator
    calls per step (nested ones counted, as the profiler lists them) and the operators with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.tensor([list(prompt)])
    found = {}
    for name, forward in (("model step", model), ("fused decode step", FusedModel(model))):
        cache = KVCache.for_model(model, batch_size=1, max_seq_len=ids.shape[1] + 2 * steps + 1)
        token = forward(ids, positions=cache.next_positions(ids.shape[1]), kv_caches=cache)[:, -1].argmax(-1)

        def step(token: torch.Tensor, forward=forward, cache=cache) -> torch.Tensor:
            return forward(token[:, None], positions=cache.next_positions(1), kv_caches=cache)[:, -1].argmax(-1)
        for _ in range(steps // 2):                     # warm-up
            token = step(token)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                token = step(token)
        events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:6]
        found[name] = {"aten_calls_per_step": sum(e.count for e in events) / steps,
                       "top": [{"op": e.key, "self_share": e.self_cpu_time_total / total,
                                "calls_per_step": e.count / steps} for e in top]}
    return found
