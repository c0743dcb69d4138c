"""Request traces in Mooncake's format (lab 13): what arrived when, how long, and which prompt blocks it shared.

Mooncake's open traces (kvcache-ai/Mooncake, FAST'25) are JSON lines, one request each:

    {"timestamp": 3052, "input_length": 7234, "output_length": 794, "hash_ids": [0, 28, 29, 30]}

timestamp: milliseconds since the first request; input_length / output_length: tokens; hash_ids: one id per block of
the prompt (Mooncake's blocks are 512 tokens), equal ids meaning equal blocks *with equal prefixes*, so the prefix two
requests share is the common leading run of their ids. A trace says nothing of the text: to replay it, every id is
given the tokens of one block (`trace_prompts`: the same id, the same tokens), and the last block is cut to the
request's input length.

`conversation_trace` writes such a trace from the course corpus with the structure that makes caches pay: sessions
of several turns whose prompts grow by the last answer and a new question, all under one of a few shared system
prompts, sessions starting as a Poisson process and turns following after a think time (seeded).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["TraceRecord", "read_trace", "write_trace", "trace_prompts", "shared_prefix_blocks", "conversation_trace",
           "replay_over_http"]

MOONCAKE_BLOCK = 512


@dataclass(frozen=True)
class TraceRecord:
    timestamp: int            # ms since the first request
    input_length: int         # prompt tokens
    output_length: int        # tokens to generate
    hash_ids: tuple[int, ...]  # one id per prompt block: ceil(input_length / block) of them


def _record(obj: object, line: int) -> TraceRecord:
    if not isinstance(obj, dict):
        raise ValueError(f"trace line {line}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
    if missing:
        raise ValueError(f"trace line {line}: missing {', '.join(missing)} (Mooncake's format: timestamp, input_length, "
                         "output_length, hash_ids)")
    for key in ("timestamp", "input_length", "output_length"):
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
            raise ValueError(f"trace line {line}: {key} must be a whole number >= 0, got {value!r}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"trace line {line}: hash_ids must be a list of ints >= 0")
    return TraceRecord(int(obj["timestamp"]), int(obj["input_length"]), int(obj["output_length"]), tuple(ids))


def read_trace(path: str | Path) -> list[TraceRecord]:
    """The records of a Mooncake-format JSONL trace, in file order (blank lines skipped); ValueError naming the line of
    anything else."""
    records = []
    for n, text in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"trace line {n}: not JSON ({err.msg})") from None
        records.append(_record(obj, n))
    if any(b.timestamp < a.timestamp for a, b in zip(records, records[1:])):
        raise ValueError("trace timestamps must not decrease (requests in arrival order)")
    return records


def write_trace(records: Iterable[TraceRecord], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps({**asdict(r), "hash_ids": list(r.hash_ids)}) + "\n" for r in records),
                          encoding="utf-8")


def trace_prompts(records: Sequence[TraceRecord], block_size: int, corpus: Sequence[int], seed: int = 0) -> list[list[int]]:
    """A token prompt per record: hash id h gets `block_size` consecutive corpus tokens at an offset drawn from
    (seed, h), the same for every record that names h; the prompt is its ids' blocks cut to input_length."""
    offsets: dict[int, int] = {}
    prompts = []
    for r in records:
        tokens: list[int] = []
        for h in r.hash_ids:
            if h not in offsets:
                offsets[h] = random.Random(f"{seed}:{h}").randrange(len(corpus) - block_size)
            tokens += list(corpus[offsets[h]:offsets[h] + block_size])
        if len(tokens) < r.input_length:
            raise ValueError(f"a record of {r.input_length} input tokens has only {len(r.hash_ids)} hash ids of "
                             f"{block_size} tokens")
        prompts.append([int(t) for t in tokens[:r.input_length]])
    return prompts


def shared_prefix_blocks(records: Sequence[TraceRecord]) -> int:
    """Blocks an ideal cache (unbounded, never evicting) would not recompute: for each record, the longest leading run
    of its ids that an earlier record's ids start with."""
    seen: set[tuple[int, ...]] = set()
    reused = 0
    for r in records:
        run = 0
        while run < len(r.hash_ids) and tuple(r.hash_ids[:run + 1]) in seen:
            run += 1
        reused += run
        seen.update(tuple(r.hash_ids[:i]) for i in range(1, len(r.hash_ids) + 1))
    return reused


def conversation_trace(seed: int = 0, *, sessions: int = 24, turns: tuple[int, int] = (2, 5), block_size: int = 16,
                       system_prompts: int = 3, system_blocks: int = 4, question_blocks: tuple[int, int] = (1, 3),
                       answer_tokens: tuple[int, int] = (16, 48), session_rate_per_s: float = 2.0,
                       think_ms: tuple[int, int] = (500, 3000)) -> list[TraceRecord]:
    """A seeded multi-turn trace with shared system prompts (see the module docstring), sorted by arrival."""
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    systems = [fresh(system_blocks) for _ in range(system_prompts)]
    records, start = [], 0.0
    for _ in range(sessions):
        start += rng.expovariate(session_rate_per_s) * 1000
        ids, t = list(rng.choice(systems)), start
        for turn in range(rng.randint(*turns)):
            ids += fresh(rng.randint(*question_blocks))
            answer = rng.randint(*answer_tokens)
            records.append(TraceRecord(int(t), len(ids) * block_size, answer, tuple(ids)))
            ids += fresh(-(-answer // block_size))           # the answer joins the next turn's prompt
            t += rng.randint(*think_ms) + answer * 10         # reading the answer, then typing
    records.sort(key=lambda r: r.timestamp)
    first = records[0].timestamp if records else 0
    return [TraceRecord(r.timestamp - first, r.input_length, r.output_length, r.hash_ids) for r in records]


def replay_over_http(base_url: str, records: Sequence[TraceRecord], prompts: Sequence[Sequence[int]], *,
                     speed: float = 1.0, max_duration: float = 600.0, **kwargs):
    """Send each record's prompt (token ids) to an OpenAI-compatible server on loopback at the record's timestamp
    (divided by `speed`), asking for its output_length tokens; the `RequestRecord`s, for
    `minigpt.serving.client_metrics.summarize_records` (TTFT, inter-token latency, goodput)."""
    from minigpt.serving.load_generator import benchmark

    if len(prompts) != len(records):
        raise ValueError(f"{len(prompts)} prompts for {len(records)} records")
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed!r}")
    return benchmark(base_url, [list(map(int, p)) for p in prompts], arrivals=[r.timestamp / 1000 / speed for r in records],
                     max_tokens=[max(1, r.output_length) for r in records], max_duration=max_duration, **kwargs)
