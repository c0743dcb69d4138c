"""Lab 08, exercise 4: the batched LoRA matmul (lora_delta), alone, in the engine and behind the server."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from autograder.harness import call_learner, quiet, within
from autograder.checking.models import NEAR_TIE, SMALL_CONFIG, scaled_model
from autograder.lab08.common import CHECK_CONFIG, _watched, one_call_at_a_time
from autograder.checking.reference_guard import own_work
from autograder.checking.tensor_trace import TensorTrace
from autograder.checking.wire import run_where
from minigpt.cache.paged import PagedKVCache
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.request import Request
from minigpt.engine.scheduler import Scheduler, SchedulerConfig
from minigpt.engine.serving_loop import serve
from minigpt.model import GPT
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.lora import LoRAAdapters, lora_delta, merge_adapter, with_lora
from minigpt.serving.lora_runner import LoRAModelRunner
from minigpt.timing import fixed_threads


# (d_in, d_out, rank, n_adapters, rows): non-square; square with r < d (B-before-A and a transposed delta fit);
# all square (r = d: every mix-up of A and B fits and must be caught by its values).
_DELTA_CASES = [(24, 40, 4, 4, 13), (32, 32, 4, 3, 9), (8, 8, 8, 4, 10)]


def count_torch_calls(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """(fn(*args), number of torch functions and Tensor methods it called): a deterministic proxy for Python loops."""
    class Counter(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):     # type: ignore[no-untyped-def]
            Counter.calls += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        out = fn(*args)
    return out, Counter.calls


def _torch_calls_of(fn: Callable[..., Any], what: str, *args: Any) -> int:
    """How many torch calls fn(*args) makes, counted where fn runs (the learner's kernel, when judged: a torch
    function mode sees only the calls of its own process)."""
    return count_torch_calls(call_learner, what, fn, *args)[1]


def _delta_inputs(d_in: int, d_out: int, r: int, n: int, rows: int, seed: int) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d_in, generator=g)
    A = torch.randn(n, r, d_in, generator=g) / math.sqrt(d_in)
    B = torch.randn(n, d_out, r, generator=g)
    # every adapter and -1 present, in no sorted order, neighbours differ, row 0's adapter is not everyone's
    values = [n - 2, 0, -1, n - 1] + list(range(1, n - 2))
    idx = [values[0]]
    for i in range(1, rows):
        choices = [v for v in (values if i >= len(values) else [values[i]]) if v != idx[-1]]
        idx.append(choices[int(torch.randint(len(choices), (1,), generator=g))])
    idx = torch.tensor(idx)
    return x, A, B, idx


def _per_row_deltas(x: Tensor, A: Tensor, B: Tensor, s: float) -> Tensor:
    """(n_adapters, N, d_out) in float64: every row's delta under every adapter, merged-weight style."""
    dW = torch.einsum("aor,ari->aoi", B.double(), A.double()) * s          # (n, d_out, d_in): s B_a A_a
    return torch.einsum("aoi,ni->ano", dW, x.double())


_VAGUE = ("its delta is 0 although", "its delta is neither")


def _diagnose(got: Tensor, x: Tensor, A: Tensor, B: Tensor, idx: Tensor, s: float, row: int) -> str:
    """Why row `row` is wrong: another adapter's delta, the last adapter for -1, no scaling, a transposed delta."""
    all_deltas = _per_row_deltas(x, A, B, s)
    g = got[row].double()
    a = int(idx[row])

    def close(t: Tensor) -> bool:
        return t.shape == g.shape and torch.allclose(g, t, rtol=1e-3, atol=1e-4)

    if a == -1:
        if close(all_deltas[-1, row]):
            return ("it has adapter index -1 (no adapter) but got the LAST adapter's delta: A[-1] is Python's negative "
                    "indexing. Mask the rows with index -1 (delta 0).")
        for b in range(len(A)):
            if close(all_deltas[b, row]):
                return f"it has adapter index -1 (no adapter) but got adapter {b}'s delta; rows with -1 get delta 0."
        return "it has adapter index -1: its delta must be exactly 0."
    if s != 1 and close(all_deltas[a, row] / s):
        return f"its delta is missing the scaling s = alpha / r (= {s:g} here): multiply by `scaling`."
    for b in range(len(A)):
        if b != a and close(all_deltas[b, row]):
            return (f"its adapter index is {a} but it got adapter {b}'s delta: each row must use ITS OWN index "
                    "(no sorting, rolling, or reusing another row's index).")
    if close(torch.zeros_like(g)):
        return "its delta is 0 although its adapter index is not -1."
    if A.shape[2] == B.shape[1]:
        dWt = (B[a].double() @ A[a].double()).T * s
        if close(dWt @ x[row].double()):
            return "it used the transposed delta (B_a A_a)^T: the delta is B_a @ (A_a @ x), A (r, d_in) first."
        if A.shape[1] == A.shape[2] and close(s * A[a].double() @ (B[a].double() @ x[row].double())):
            return "B was applied before A: the delta is B_a @ (A_a @ x) (A shrinks d_in to r, B expands r to d_out)."
    return "its delta is neither this row's adapter's, another adapter's, nor zero."


def _own_lora(lora_delta_fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Refuse the reference handed in; the returned function refuses a wrapper that calls it, in any thread."""
    what = "Exercise 4 (lora_delta)"
    own_work(lora_delta_fn, lora_delta, what=what)
    return one_call_at_a_time(_watched(lora_delta_fn, (lora_delta,), what))


def check_lora_delta(lora_delta_fn: Callable[..., Tensor]) -> None:
    """lora_delta_fn(x (N, d_in), A (n, r, d_in), B (n, d_out, r), adapter_idx (N,), scaling) -> (N, d_out).

    On mixed batches (every adapter and -1 present, unsorted), W x + delta must equal running each row alone through
    the MERGED weight W + s B_a A_a (W alone for -1); the inputs must be left unchanged; and the number of torch
    calls must not grow with the number of rows (gather + batched matmuls, no Python loop over rows).
    """
    learner_fn, lora_delta_fn = lora_delta_fn, _own_lora(lora_delta_fn)
    for case, (d_in, d_out, r, n, rows) in enumerate(_DELTA_CASES):
        x, A, B, idx = _delta_inputs(d_in, d_out, r, n, rows, seed=case)
        s = 2.0 / r if r != 2 else 0.75                  # never 1: a missing scaling shows
        g = torch.Generator().manual_seed(100 + case)
        W = torch.randn(d_out, d_in, generator=g)
        saved = [t.clone() for t in (x, A, B, idx)]
        what = f"lora_delta on {rows} rows, {n} adapters of rank {r}, d_in={d_in}, d_out={d_out}, scaling {s:g}"
        got = call_learner(what, lora_delta_fn, x, A, B, idx, s)
        for name, before, after in zip(("x", "A", "B", "adapter_idx"), saved, (x, A, B, idx)):
            if not torch.equal(before, after):
                raise AssertionError(f"{what}: your function changed its input `{name}` in place (e.g. clamp_ or "
                                     "masked_fill_ on the caller's tensor); work on a copy")
        if not isinstance(got, Tensor) or tuple(got.shape) != (rows, d_out):
            raise AssertionError(f"{what}: expected a tensor of shape ({rows}, {d_out}), got "
                                 f"{tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__}")
        if not torch.isfinite(got).all():
            raise AssertionError(f"{what}: the result has NaN or inf values")
        wrong = []
        for i in range(rows):               # the reference: the row alone through the merged weight
            a = int(idx[i])
            merged = W.double() + (s * B[a].double() @ A[a].double() if a >= 0 else 0)
            want = merged @ x[i].double()
            if not torch.allclose(W.double() @ x[i].double() + got[i].double(), want, rtol=1e-4, atol=1e-4):
                wrong.append(i)
        if wrong:
            why = {i: _diagnose(got.detach(), x, A, B, idx, s, i) for i in wrong}
            i = next((i for i in wrong if not why[i].startswith(_VAGUE)), wrong[0])
            raise AssertionError(f"{what}: {len(wrong)} of {rows} rows differ from running each row alone with its "
                                 f"adapter merged (W + s B_a A_a); row {i} (adapter index {int(idx[i])}; indices "
                                 f"{idx.tolist()}): {why[i]}")
    # no Python loop over rows: the same adapters, 8 rows against 64 rows, counted where the function runs
    x8, A8, B8, i8 = _delta_inputs(16, 16, 4, 4, 8, seed=7)
    x64, _, _, i64 = _delta_inputs(16, 16, 4, 4, 64, seed=8)
    few = run_where(learner_fn, _torch_calls_of, learner_fn, "lora_delta on 8 rows", x8, A8, B8, i8, 0.5)
    many = run_where(learner_fn, _torch_calls_of, learner_fn, "lora_delta on 64 rows", x64, A8, B8, i64, 0.5)
    if many > few + 8:
        raise AssertionError(f"lora_delta made {few} torch calls for 8 rows and {many} for 64 rows (same 4 adapters): "
                             "it loops over rows in Python. Gather every row's factors at once (A[idx], B[idx]) and "
                             "apply them with batched matmuls (torch.bmm / einsum).")
    _check_largest_tensor(lora_delta_fn)


def _check_largest_tensor(lora_delta_fn: Callable[..., Tensor], rows: int = 32, d: int = 128, r: int = 4) -> None:
    """The cost of the method, not only its values: no tensor much larger than the factors gathered per row
    (rows x r x d numbers). Merging each row's delta B_a A_a first (rows x d x d) gives the same values from a
    tensor d / r = 32 times larger, the cost LoRA exists to avoid."""
    x, A, B, idx = _delta_inputs(d, d, r, 4, rows, seed=9)
    what = f"lora_delta on {rows} rows, 4 adapters of rank {r}, d_in = d_out = {d}"
    with TensorTrace() as trace:
        call_learner(what, lora_delta_fn, x, A, B, idx, 0.5)
    largest = max((math.prod(shape) for call in trace.calls for shape in call.outputs), default=0)
    bound = 2 * rows * r * d
    if not within(largest, bound):
        shape = next(shape for call in trace.calls for shape in call.outputs if math.prod(shape) == largest)
        raise AssertionError(f"{what}: your function built a tensor of shape {shape} ({largest} numbers); the factors "
                             f"gathered per row hold {rows * r * d} each. A delta merged per row (B_a @ A_a, d_out x "
                             "d_in) is what LoRA avoids: apply A first (rank r), then B, to each row's x.")


def small_model(seed: int = 0) -> GPT:
    """The small random model of lab 03's checks (autograder.checking.models: matrices scaled x6, so that greedy outputs
    depend on the context)."""
    return scaled_model(seed)


def _divergence(model: GPT, prompt: list[int], got: list[int], want: list[int]) -> str | None:
    """None if got == want up to a near-tie; else where they first really differ."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            with torch.inference_mode():
                top = model(torch.tensor([prompt + want[:i]]))[0, -1].float().topk(2).values
            if (top[0] - top[1]).item() < NEAR_TIE:
                return None
            return f"token {i}: got {a}, with its adapter merged it is {b}"
    return None if len(got) == len(want) else f"{len(got)} tokens instead of {len(want)}"


def check_lora_engine(lora_delta_fn: Callable[..., Tensor], *, layout: str = "packed") -> dict[str, int]:
    """Serve 9 requests of 3 adapters and the base model (the same prompt under several adapters among them) with
    lab 03's scheduler and the LoRA runner using `lora_delta_fn`: each greedy output must equal generating that
    prompt alone with its adapter merged into the weights. Returns {"steps", "mixed_steps"}."""
    lora_delta_fn = _own_lora(lora_delta_fn)
    model = small_model()
    adapters = LoRAAdapters.random(model, ["sql", "poem", "chat"], rank=4, seed=1)
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 255, (14,), generator=g).tolist()
    plan = [(0, shared), (1, shared), (2, shared), (-1, shared)]
    plan += [(a, torch.randint(0, 255, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist())
             for a in (2, 0, -1, 1, 0)]
    reqs = [Request(i, p, int(torch.randint(4, 14, (1,), generator=g)), stop_token_ids=()) for i, (_, p) in enumerate(plan)]
    adapter_of = {i: a for i, (a, _) in enumerate(plan)}
    merged = {a: merge_adapter(model, adapters, a) for a in range(len(adapters))}
    merged[-1] = model
    mixed = []
    with fixed_threads(1):
        want = {r.request_id: generate_kv_cache(merged[adapter_of[r.request_id]], list(r.prompt), r.max_new_tokens,
                                                stop_token_ids=()).tokens for r in reqs}
        cache = PagedKVCache.for_model(model, 64, 4)
        runner = LoRAModelRunner(with_lora(model, adapters, delta_fn=lora_delta_fn), cache, layout,
                                 adapter_of=lambda seq: adapter_of[seq.seq_id])
        execute = runner.execute

        def counting(out: Any) -> Any:
            mixed.append(len({adapter_of[c.seq_id] for c in out.chunks}) > 1)
            return execute(out)

        sch = Scheduler(cache.manager, SchedulerConfig(6, 24), max_model_len=SMALL_CONFIG.max_seq_len)
        with quiet():
            res = call_learner(f"serving 9 requests of 3 adapters ({layout} layout)", serve, reqs, sch, counting)
    for seq in res.sequences:
        a = adapter_of[seq.seq_id]
        bad = _divergence(merged[a], list(seq.prompt), list(seq.output_tokens), want[seq.seq_id])
        if bad:
            raise AssertionError(f"request {seq.seq_id} (adapter {a if a >= 0 else 'none (-1)'}, served in a batch mixing "
                                 f"adapters) differs from generating it alone with that adapter merged, at {bad}. "
                                 "Run check_lora_delta first: each token row must get its own request's adapter.")
    return {"steps": len(mixed), "mixed_steps": sum(mixed)}


def served_lora_model(seed: int = 3) -> tuple[GPT, LoRAAdapters]:
    """A tiny random model over the course vocabulary (text prompts work; weights x4 so that greedy outputs depend on
    the adapter) and three adapters named adapter-0 .. adapter-2."""
    model = scaled_model(seed, CHECK_CONFIG, scale=4.0)
    return model, LoRAAdapters.random(model, ["adapter-0", "adapter-1", "adapter-2"], rank=4, seed=seed - 1)


def check_lora_server(lora_delta_fn: Callable[..., Tensor]) -> dict[str, str]:
    """Serve the tiny model with three adapters (the learner's `lora_delta_fn` in the engine) on a free loopback port;
    five concurrent completions through the official openai client, `model` = an adapter name or the base ("tiny"):
    each text must equal greedy generation with that adapter merged; model="adapter-9" must get 404. Returns the texts."""
    lora_delta_fn = _own_lora(lora_delta_fn)
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.lora_runner import engine_with_adapters
    from minigpt.tokenizer import load_tokenizer

    enc = load_tokenizer()
    model, adapters = served_lora_model()
    prompt = "def parse(args):"
    names = ["adapter-2", "tiny", "adapter-0", "adapter-1", "adapter-2"]
    with quiet():
        engine = engine_with_adapters(model, adapters, EngineConfig(num_blocks=64, block_size=8), tokenizer=enc,
                                      model_name="tiny", delta_fn=lora_delta_fn)
        with serve_in_thread(create_app(AsyncLLMEngine(engine), max_queue=16)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

            def ask(name: str) -> str:
                return client.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0).choices[0].text
            try:
                with ThreadPoolExecutor(len(names)) as pool:
                    texts = list(pool.map(ask, names))
            except openai.APIError as err:
                raise AssertionError(f"a completion naming an adapter failed: {err}. The engine step raised: is your "
                                     "lora_delta implemented and passing check_lora_delta?") from None
            try:
                client.completions.create(model="adapter-9", prompt=prompt, max_tokens=4)
                unknown = "accepted"
            except openai.NotFoundError:
                unknown = "404"
            except openai.APIError as err:
                unknown = f"{type(err).__name__}"
    if unknown != "404":
        raise AssertionError(f"model='adapter-9' (no such adapter) should get 404 model_not_found, got {unknown}")
    ids = enc.encode(prompt)
    for name, text in zip(names, texts):
        ref = model if name == "tiny" else merge_adapter(model, adapters, name)
        want = enc.decode(generate_kv_cache(ref, ids, 10, stop_token_ids=()).tokens)
        if text != want:
            raise AssertionError(f"model={name!r} (served together with requests of other adapters) answered {text!r}; "
                                 f"generating alone with {name} merged gives {want!r}. Each row must use its own "
                                 "request's adapter (run check_lora_delta first).")
    return dict(zip(names, texts))
