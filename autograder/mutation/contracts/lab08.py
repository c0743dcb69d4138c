"""Lab 08's contracts (serving): the differential tests that show a mutant equivalent.

ex1_code  sse_stream(outputs, make_chunks, abort): an async generator driven on a fresh event loop through a drawn
          stream: 0 to 4 engine outputs, each with 0 to 2 chunks (any JSON: non-ASCII text, nesting, numbers), the
          last one finished or not (a stream that ends without its finished output); then the consumer reads to the
          end, closes the generator after some events (aclose: GeneratorExit at its yield), or cancels the task
          while it waits for an output that is not there yet (CancelledError at its await); or the engine fails
          after some outputs (outputs raises). Compared: one log, in order, of every event yielded, every abort()
          call, and how the consumer's side ended (the exception's type).
ex2_code  admitted(slots, retry_after_s): an async context manager driven on a fresh event loop through a drawn script
          of 0 to 12 steps on slots of capacity 1 to 3 (any starting in_use up to the capacity): enter once more
          (admitted, or QueueFull at once), or leave one of the requests inside, picked by position, as a request
          ends: finished, failed (an exception passing out), or cancelled (CancelledError). Compared: after every
          step, in_use, what entering raised (its type and retry_after) and what leaving let out.
ex4_code  lora_delta(x, A, B, adapter_idx, scaling): N from 0 (an empty batch), 1 to 3 adapters, rank 1 to 4,
          d_in and d_out 1 to 6, every row's adapter in -1 ("no adapter") .. n_adapters - 1, any scaling (0 too),
          float32, float64, bfloat16, float16, values up to 1e30 (overflow to inf in the narrow dtypes), the meta
          device. Compared: the deltas, dtype, shape and device included.
ex5_code  route(prompt_token_ids, replicas, *, block_size, prefix_blocks): prompts of 0 to 80 tokens (41 per
          drawn input), 1 to 5 replicas named by any text (in any order), blocks of 1 to 16 tokens, 1 to 4 prefix
          blocks. Compared: the replica chosen for each prompt (or the exception's type).
"""

from __future__ import annotations

import asyncio

import torch
from hypothesis import strategies as st

from autograder.mutation.equivalence import Contract, Raised, call_with

# -- ex1: sse_stream ------------------------------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                   max_size=3), max_leaves=6)


def _sse_inputs(ns: dict):
    def build(draw):
        n = draw(st.integers(0, 4))
        chunks = [draw(st.lists(st.dictionaries(st.text(max_size=5), _json, max_size=3), max_size=2))
                  for _ in range(n)]
        ends_finished = draw(st.booleans())
        consumer = draw(st.sampled_from(["read all", "close", "cancel", "engine fails"]))
        after = draw(st.integers(0, 6))
        return chunks, ends_finished, consumer, after
    return st.composite(lambda draw: build(draw))()


def _sse_corners(ns: dict) -> list:
    three = [[{"text": "Hello"}], [{"text": ", wor"}], [{"text": "ld!", "finish_reason": "length"}]]
    return [(three, True, "read all", 0), (three, True, "close", 1), (three[:1], True, "cancel", 1),
            (three, True, "engine fails", 1), ([], False, "read all", 0), ([], True, "cancel", 0),
            (three, False, "read all", 0), (three, True, "close", 3), (three, True, "close", 4),
            ([[], [{"t": "é"}]], True, "close", 0)]


def _sse_run(fn, value):
    from minigpt.serving.outputs import RequestOutput

    chunks, ends_finished, consumer, after = value
    n = len(chunks)
    outs = [RequestOutput("r", [10 + i], f"t{i}", ends_finished and i == n - 1,
                          "length" if ends_finished and i == n - 1 else None, 3, i + 1) for i in range(n)]
    by_output = {id(o): c for o, c in zip(outs, chunks)}
    log: list = []

    async def outputs():
        for i, out in enumerate(outs):
            if consumer == "engine fails" and i == after:
                raise RuntimeError("the engine failed mid-stream")
            yield out
        if consumer == "engine fails":
            raise RuntimeError("the engine failed mid-stream")
        if consumer == "cancel":
            await asyncio.Event().wait()            # the next output is not there yet

    def make_chunks(out):
        return [dict(c) for c in by_output[id(out)]]

    def abort():
        log.append("abort")

    async def drive():
        agen = fn(outputs(), make_chunks, abort)
        if consumer == "close":
            for _ in range(after):
                try:
                    log.append(("event", await agen.__anext__()))
                except StopAsyncIteration:
                    log.append("end")
                    return
            await agen.aclose()
            log.append("closed")
            return
        if consumer == "cancel":
            async def consume():
                async for e in agen:
                    log.append(("event", e))
            task = asyncio.ensure_future(consume())
            for _ in range(20):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
                log.append("end")
            except asyncio.CancelledError:
                log.append("cancelled")
            return
        async for e in agen:
            log.append(("event", e))
        log.append("end")

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive())
    except Exception as err:                        # noqa: BLE001
        log.append(Raised(type(err).__name__))
    finally:                                        # a generator left open is finalised here, in the log's order
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return log


# -- ex2: admitted -------------------------------------------------------------------------------------------------

def _admission_inputs(ns: dict):
    step = st.tuples(st.sampled_from(["enter", "finished", "failed", "cancelled"]), st.integers(0, 3))
    return st.tuples(st.integers(1, 3), st.integers(0, 3), st.sampled_from([0.5, 1.0, 7.0]),
                     st.lists(step, max_size=12))


def _admission_corners(ns: dict) -> list:
    fill = [("enter", 0)] * 3
    return [(1, 0, 1.0, []), (1, 1, 1.0, [("enter", 0)]), (2, 0, 0.5, fill + [("finished", 0), ("enter", 0)]),
            (3, 0, 7.0, fill + [("failed", 1), ("cancelled", 0), ("finished", 0), ("enter", 0)]),
            (3, 3, 1.0, [("enter", 0), ("finished", 0)])]


def _admission_run(fn, value):
    from minigpt.serving.admission import AdmissionSlots

    capacity, start, retry, steps = value
    slots = AdmissionSlots(capacity, min(start, capacity))
    inside: list = []
    log: list = []

    async def drive():
        for what, which in steps:
            if what == "enter":
                manager = fn(slots, retry)
                try:
                    await manager.__aenter__()
                    inside.append(manager)
                    log.append(("in", slots.in_use))
                except Exception as err:            # noqa: BLE001
                    log.append(("refused", type(err).__name__, getattr(err, "retry_after", None), slots.in_use))
                continue
            if not inside:
                continue
            manager = inside.pop(which % len(inside))
            err = {"finished": None, "failed": RuntimeError("the request failed"),
                   "cancelled": asyncio.CancelledError()}[what]
            try:
                kept = await manager.__aexit__(type(err) if err else None, err, None)
                log.append((what, "swallowed" if kept and err else "let out", slots.in_use))
            except BaseException as raised:         # noqa: BLE001  (CancelledError is a BaseException)
                log.append((what, "raised", type(raised).__name__, raised is err, slots.in_use))

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive())
    except Exception as err:                        # noqa: BLE001
        log.append(Raised(type(err).__name__))
    finally:
        loop.close()
    return log


# -- ex4: lora_delta ------------------------------------------------------------------------------------------------

_FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _lora_inputs(ns: dict):
    def build(draw):
        n_adapters, r = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        d_in, d_out, N = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(0, 6))
        idx = draw(st.lists(st.integers(-1, n_adapters - 1), min_size=N, max_size=N))
        scaling = draw(st.sampled_from([0.0, 0.5, 2.0, 16.0, -1.0]))
        return N, d_in, d_out, n_adapters, r, idx, scaling, draw(st.sampled_from(_FLOATS)), \
            draw(st.sampled_from([1.0, 1.0, 1e30])), draw(st.integers(0, 2**16)), "cpu"
    return st.composite(lambda draw: build(draw))()


def _lora_corners(ns: dict) -> list:
    return [(3, 8, 8, 2, 2, [1, -1, 0], 0.5, torch.float32, 1.0, 0, "cpu"),
            (0, 4, 4, 2, 2, [], 1.0, torch.float32, 1.0, 1, "cpu"),                 # an empty batch
            (4, 4, 3, 3, 2, [-1, -1, -1, -1], 2.0, torch.float64, 1.0, 2, "cpu"),   # no adapter at all
            (3, 4, 3, 2, 1, [-1, 1, 0], 2.0, torch.bfloat16, 1e30, 3, "cpu"),       # inf deltas, masked rows
            (3, 4, 3, 2, 2, [1, -1, 0], 0.5, torch.float32, 1.0, 4, "meta")]


def _lora_run(fn, value):
    N, d_in, d_out, n_adapters, r, idx, scaling, dtype, scale, seed, device = value
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(N, d_in, generator=g) * scale).to(dtype).to(device)
    A = torch.randn(n_adapters, r, d_in, generator=g).to(dtype).to(device)
    B = torch.randn(n_adapters, d_out, r, generator=g).to(dtype).to(device)
    adapter_idx = torch.tensor(idx, dtype=torch.int64).to(device)
    return call_with(fn, (x, A, B, adapter_idx, scaling))


# -- ex5: route -----------------------------------------------------------------------------------------------------

def _route_inputs(ns: dict):
    return st.tuples(st.lists(st.integers(0, 50_000), max_size=80),
                     st.lists(st.text(min_size=1, max_size=24), min_size=1, max_size=5, unique=True),
                     st.integers(1, 16), st.integers(1, 4), st.integers(0, 2**16))


def _route_corners(ns: dict) -> list:
    four = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003", "http://127.0.0.1:8004"]
    return [([], four, 16, 4, 0), ([7], four[:1], 16, 4, 1), (list(range(64)), four, 16, 4, 2),
            (list(range(100, 140)), four[:2], 16, 4, 3), (list(range(5)), four[::-1], 1, 1, 4),
            ([5956, 8346, 25781, 25143, 39174], four, 16, 4, 5)]


def _route_run(fn, value):
    """The drawn prompt's replica, then those of 40 more seeded prompts on the same replicas: a ring that differs
    in a few points moves only a few keys (about 1 in 60 for one point more per replica)."""
    import random

    prompt, replicas, block_size, prefix_blocks, seed = value
    rng = random.Random(seed)
    prompts = [prompt] + [[rng.randrange(50_000) for _ in range(rng.randint(0, 80))] for _ in range(40)]
    return [call_with(fn, ((p, list(replicas)), {"block_size": block_size, "prefix_blocks": prefix_blocks}))
            for p in prompts]


CONTRACTS = {
    "ex1_code": Contract("sse_stream", _sse_inputs, run=_sse_run, corners=_sse_corners, examples=200),
    "ex2_code": Contract("admitted", _admission_inputs, run=_admission_run, corners=_admission_corners,
                         examples=200),
    "ex4_code": Contract("lora_delta", _lora_inputs, run=_lora_run, corners=_lora_corners, examples=200),
    "ex5_code": Contract("route", _route_inputs, run=_route_run, corners=_route_corners, examples=60),
}
