"""Mooncake-format traces: reading (clear errors), writing, prompts from hash ids, the ideal reuse, the synthetic
multi-turn trace."""

import json

import pytest

from minigpt.serving.trace import (TraceRecord, conversation_trace, read_trace, shared_prefix_blocks, trace_prompts,
                                   write_trace)

MOONCAKE_LINES = [
    {"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 7319, "output_length": 490, "hash_ids": [0] + list(range(14, 28))},
    {"timestamp": 3052, "input_length": 2287, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]},
]


def test_round_trip_and_the_ideal_reuse(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in MOONCAKE_LINES) + "\n\n")
    records = read_trace(path)
    assert records[2] == TraceRecord(3052, 2287, 316, (0, 42, 43, 44, 45))
    assert shared_prefix_blocks(records) == 2            # block 0 reused by the second and the third request
    write_trace(records, tmp_path / "again.jsonl")
    assert read_trace(tmp_path / "again.jsonl") == records


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "JSON object"), ('{"timestamp": 0}', "missing"), ("{not json", "not JSON"),
    ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}', "timestamp"),
    ('{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [0]}', "input_length"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [true]}', "hash_ids"),
])
def test_bad_lines_are_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(MOONCAKE_LINES[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"line 2: .*{message}|{message}"):
        read_trace(path)


def test_prompts_share_tokens_where_ids_are_shared():
    records = [TraceRecord(0, 10, 4, (5, 6, 7)), TraceRecord(1, 7, 4, (5, 6))]
    corpus = list(range(1000))
    a, b = trace_prompts(records, 4, corpus, seed=3)
    assert len(a) == 10 and len(b) == 7 and a[:7] == b[:7]
    with pytest.raises(ValueError, match="hash ids"):
        trace_prompts([TraceRecord(0, 20, 1, (1,))], 4, corpus)


def test_the_conversation_trace_is_seeded_and_reuses_its_prefixes():
    a, b = conversation_trace(1), conversation_trace(1)
    assert a == b and a != conversation_trace(2)
    assert a[0].timestamp == 0 and all(x.timestamp <= y.timestamp for x, y in zip(a, a[1:]))
    assert all(r.input_length == 16 * len(r.hash_ids) for r in a)
    total = sum(len(r.hash_ids) for r in a)
    assert shared_prefix_blocks(a) / total > 0.5         # system prompts and earlier turns: most blocks repeat


def test_a_trace_served_by_the_course_server_with_each_prefix_cache():
    """The first 12 requests of the seeded conversation trace, sped up 10x, against a fresh server per prefix cache
    (in this process, the draft model): every request served, and the server's own counters find the prefixes
    the trace shares (a roomy pool: every cache finds exactly what the ideal cache finds, in whole blocks)."""
    from minigpt.serving.experiments import serve_trace
    from minigpt.training.data import load_tokens

    records = conversation_trace(0)[:12]
    prompts = trace_prompts(records, 16, load_tokens("val").tolist())
    served = serve_trace(records, prompts, checkpoint="draft", speed=10.0, num_blocks=512, max_duration=120.0)
    assert [s.cache for s in served] == ["hash", "radix", "radix+host"]
    for s in served:
        assert s.summary.num_ok == len(records) and s.summary.num_failed == 0
        assert s.queried_tokens == sum(r.input_length for r in records)
    assert served[0].hit_tokens == served[1].hit_tokens == served[2].hit_tokens > 0
