"""The course's `vllm bench serve` (lab 08): an open-loop load generator for OpenAI-compatible servers.

Requests arrive as a Poisson process at `rate` requests/s: inter-arrival gaps are i.i.d. exponential
with mean 1/rate (seeded), so the client sends on schedule whether or not earlier requests are done
(open loop, like real users; a closed loop that waits for answers would hide queueing). rate = inf
sends everything at t = 0. Each request streams (`stream: true`, `stream_options.include_usage`), and
the client records when every text chunk arrived (`client_metrics.RequestRecord`).

Bounded: at most len(prompts) (or max_requests) requests, and `max_duration` seconds of wall time;
requests still running then are cancelled and recorded as failed. Loopback only: any other host is
refused before a byte is sent.

From a shell: `python -m minigpt.serving.load_generator --url http://127.0.0.1:8000 --rate 4` (see --help).

Workloads: `corpus_prompts` (windows of the validation corpus) and `shared_prefix_prompts` (a few
system prompts, each several KV blocks long, times many short questions: the prefix-cache workload).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import time
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit

import httpx
import numpy as np

from minigpt.serving.aio import run_sync
from minigpt.serving.client_metrics import RequestRecord

__all__ = ["Workload", "check_loopback", "poisson_arrivals", "corpus_prompts", "shared_prefix_prompts",
           "run_benchmark", "benchmark", "main"]


@dataclass(frozen=True)
class Workload:
    """Prompts and, for the shared-prefix mix, the system prompt index of each (None for corpus prompts)."""
    prompts: list[str]
    prefix_ids: list[int] | None = None


def check_loopback(base_url: str) -> str:
    """The URL without a trailing slash if its host is loopback (127.0.0.0/8, ::1, localhost); else ValueError."""
    host = urlsplit(base_url).hostname
    if host is None:
        raise ValueError(f"not a URL with a host: {base_url!r} (expected e.g. http://127.0.0.1:8000)")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the load generator only targets servers on this machine (loopback), not {host!r}: "
                         "load tests against other hosts are not what this course's tool is for")
    return base_url.rstrip("/")


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (s, from 0) of n requests: cumulative sums of Exponential(mean 1/rate) gaps, first at 0;
    all zeros for rate = inf."""
    if n < 0 or not rate > 0:
        raise ValueError(f"need n >= 0 and rate > 0 (inf for all at once), got n={n}, rate={rate}")
    if math.isinf(rate) or n == 0:
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def _windows(n: int, length: int, rng: np.random.Generator) -> list[list[int]]:
    from minigpt.training.data import load_tokens
    from minigpt.tokenizer import EOT_ID

    tokens = load_tokens("val")
    out: list[list[int]] = []
    while len(out) < n:
        start = int(rng.integers(0, len(tokens) - length))
        window = tokens[start:start + length].tolist()
        if EOT_ID not in window:             # one document per window, no special token inside a prompt
            out.append(window)
    return out


def corpus_prompts(n: int, *, prompt_tokens: int = 64, seed: int = 0) -> Workload:
    """n prompts: random windows of `prompt_tokens` tokens of the validation corpus, decoded to text."""
    from minigpt.tokenizer import load_tokenizer

    enc = load_tokenizer()
    return Workload([enc.decode(w) for w in _windows(n, prompt_tokens, np.random.default_rng(seed))])


def shared_prefix_prompts(num_prefixes: int, questions_per_prefix: int, *, prefix_tokens: int = 80,
                          question_tokens: int = 16, seed: int = 0) -> Workload:
    """num_prefixes system prompts (`prefix_tokens` corpus tokens each: several KV blocks) x questions_per_prefix
    different questions (`question_tokens` each), in a seeded random order. Each prompt is
    `system + "\\n" + question`; prompts of one system prompt share its tokens (the first blocks)."""
    from minigpt.tokenizer import load_tokenizer

    enc = load_tokenizer()
    rng = np.random.default_rng(seed)
    systems = [enc.decode(w) for w in _windows(num_prefixes, prefix_tokens, rng)]
    questions = [enc.decode(w) for w in _windows(num_prefixes * questions_per_prefix, question_tokens, rng)]
    pairs = [(i, systems[i] + "\n" + questions[i * questions_per_prefix + j])
             for i in range(num_prefixes) for j in range(questions_per_prefix)]
    order = rng.permutation(len(pairs))
    return Workload([pairs[k][1] for k in order], [pairs[k][0] for k in order])


def _body(prompt: str | list[int], *, chat: bool, model: str, max_tokens: int, temperature: float) -> dict:
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                  "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def _one(client: httpx.AsyncClient, url: str, body: dict, record: RequestRecord, chat: bool) -> None:
    """Send one streaming request and fill `record` (times on time.perf_counter's clock)."""
    try:
        async with client.stream("POST", url, json=body) as response:
            record.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    record.error = f"error in stream: {chunk['error']}"
                    return
                for choice in chunk.get("choices") or []:
                    piece = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if piece:
                        record.chunk_times.append(time.perf_counter())
                        record.text += piece
                usage = chunk.get("usage")
                if usage:
                    record.output_tokens = int(usage.get("completion_tokens", 0))
                    record.prompt_tokens = int(usage.get("prompt_tokens", 0))
            if not done:
                record.error = "the stream ended without data: [DONE]"
    except asyncio.CancelledError:
        record.error = "cancelled: the benchmark's max_duration ran out"
        raise
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as err:
        record.error = f"{type(err).__name__}: {err}"
    finally:
        record.end_time = time.perf_counter()


async def _first_model(client: httpx.AsyncClient, base: str) -> str:
    response = await client.get(base + "/v1/models")
    if response.status_code != 200 or not response.json().get("data"):
        raise ValueError(f"{base}/v1/models did not list a model ({response.status_code}); pass model=...")
    return response.json()["data"][0]["id"]


async def run_benchmark(base_url: str, prompts: Sequence[str | list[int]] | Workload, *, rate: float = math.inf,
                        max_tokens: int | Sequence[int] = 32, chat: bool = False, model: str | None = None,
                        temperature: float = 0.0, seed: int = 0, max_requests: int | None = None,
                        max_duration: float = 60.0, max_concurrency: int | None = None,
                        arrivals: Sequence[float] | None = None) -> list[RequestRecord]:
    """Send the prompts to `base_url` (/v1/completions, or /v1/chat/completions if chat) at Poisson `rate`, or at
    `arrivals` (seconds from the start, one per prompt: a trace's timestamps); return one RequestRecord per request
    sent, in prompt order. A prompt is text or token ids (completions only); max_tokens is one limit or one per
    prompt. Bounded by max_requests and max_duration (s). `model` defaults to the first model the server lists at
    GET /v1/models."""
    base = check_loopback(base_url)
    prompts = list(prompts.prompts if isinstance(prompts, Workload) else prompts)[:max_requests]
    if not max_duration > 0:
        raise ValueError(f"max_duration must be > 0 seconds, got {max_duration}")
    limits_per = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)[:len(prompts)]
    if len(limits_per) != len(prompts):
        raise ValueError(f"max_tokens gives {len(limits_per)} limits for {len(prompts)} prompts")
    url = base + ("/v1/chat/completions" if chat else "/v1/completions")
    if arrivals is None:
        offsets = poisson_arrivals(len(prompts), rate, seed)
    else:
        offsets = [float(t) for t in list(arrivals)[:len(prompts)]]
        if len(offsets) != len(prompts) or any(b < a for a, b in zip(offsets, offsets[1:])) or \
                any(not t >= 0 for t in offsets):
            raise ValueError("arrivals must give one time >= 0 per prompt, in order")
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=max(10, max_concurrency or len(prompts)))
    timeout = httpx.Timeout(max_duration, connect=10.0)

    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        if model is None:
            model = await _first_model(client, base)
        start = time.perf_counter()
        deadline = start + max_duration

        async def fire(i: int, prompt: str) -> None:
            await asyncio.sleep(max(0.0, start + offsets[i] - time.perf_counter()))
            if limit is not None:
                await limit.acquire()
            try:
                record = RequestRecord(request_id=i, send_time=time.perf_counter())
                records.append(record)
                body = _body(prompt, chat=chat, model=model, max_tokens=limits_per[i], temperature=temperature)
                await _one(client, url, body, record, chat)
            finally:
                if limit is not None:
                    limit.release()

        tasks = [asyncio.create_task(fire(i, p)) for i, p in enumerate(prompts) if offsets[i] < max_duration]
        if not tasks:
            return []
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return sorted(records, key=lambda r: r.request_id)


def benchmark(base_url: str, prompts: Sequence[str] | Workload, **kwargs) -> list[RequestRecord]:
    """`run_benchmark` from synchronous code, also inside Jupyter (`minigpt.serving.aio.run_sync`)."""
    return run_sync(run_benchmark(base_url, prompts, **kwargs))


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m minigpt.serving.load_generator --url http://127.0.0.1:8000 --rate 4 --num-prompts 32`: one
    benchmark, its summary printed (what vLLM's `vllm bench serve` prints)."""
    import argparse

    from minigpt.serving.client_metrics import summarize_records

    p = argparse.ArgumentParser(prog="python -m minigpt.serving.load_generator", description=main.__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL (loopback only)")
    p.add_argument("--rate", type=float, default=math.inf, help="requests/s (Poisson); inf = all at once")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--workload", choices=["corpus", "shared-prefix"], default="corpus")
    p.add_argument("--prompt-tokens", type=int, default=64, help="corpus prompts: tokens per prompt")
    p.add_argument("--system-prompts", type=int, default=4, help="shared-prefix: distinct system prompts")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--model", default=None, help="default: the first model of GET /v1/models")
    p.add_argument("--max-duration", type=float, default=120.0, help="seconds; requests still running are cut")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ttft-slo", type=float, default=1.0, help="goodput's TTFT objective (s)")
    p.add_argument("--tpot-slo", type=float, default=0.1, help="goodput's TPOT objective (s per token)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.workload == "corpus":
        work = corpus_prompts(args.num_prompts, prompt_tokens=args.prompt_tokens, seed=args.seed)
    else:
        per = -(-args.num_prompts // args.system_prompts)
        work = shared_prefix_prompts(args.system_prompts, per, seed=args.seed)
    records = benchmark(args.url, work, rate=args.rate, max_tokens=args.max_tokens, chat=args.chat, model=args.model,
                        seed=args.seed, max_requests=args.num_prompts, max_duration=args.max_duration,
                        max_concurrency=args.max_concurrency)
    if not records:
        print("no request was sent")
        return
    print(summarize_records(records, ttft_limit=args.ttft_slo, tpot_limit=args.tpot_slo).row())


if __name__ == "__main__":
    main()
