"""Lab 08 checks, shared: the tiny check model, the reference server in a thread, small waits and guards."""

from __future__ import annotations

import inspect
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

from autograder.harness import call_learner, quiet
from autograder.checking.models import scaled_model
from autograder.checking.reference_guard import no_calls_into
from autograder.checking.reference_guard import watched as _watched
from autograder.checking.wire import run_where
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.serving.admission import admitted
from minigpt.serving.aio import run_sync
from minigpt.serving.api_server import create_app
from minigpt.serving.async_engine import AsyncLLMEngine
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.launch import serve_in_thread
from minigpt.serving.streaming import sse_stream


# A tiny random model over the course vocabulary (text prompts work); weights scaled x6 so that greedy text varies.
CHECK_CONFIG = ModelConfig(vocab_size=4096, max_seq_len=128, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)
MODEL_NAME = "minigpt-check"
TIMEOUT_S = 10.0            # generous: the machine may be busy; a correct server answers in well under a second
REFUSAL_TIMEOUT_S = 2.0     # a full queue must answer 429 within this (an admission that waits never does)
DISCONNECT_WAIT_S = 3.0     # a disconnected client's blocks must be free within this
ABORTED = 'minigpt_requests_total{outcome="abort"}'
REJECTED = 'minigpt_requests_total{outcome="rejected"}'


def _model(seed: int = 0) -> GPT:
    return scaled_model(seed, CHECK_CONFIG)


@contextmanager
def check_server(*, stream_handler: Callable = sse_stream, admission: Callable = admitted,
                 max_queue: int = 8) -> Iterator[tuple[str, AsyncLLMEngine]]:
    """The reference server with the given pieces, in a thread on a free loopback port; yields (base URL, engine)."""
    from minigpt.tokenizer import load_tokenizer
    engine = LLMEngine(_model(), EngineConfig(num_blocks=64, block_size=8, max_num_seqs=8, max_num_batched_tokens=64),
                       tokenizer=load_tokenizer(), model_name=MODEL_NAME)
    aengine = AsyncLLMEngine(engine, num_threads=1)
    app = create_app(aengine, max_queue=max_queue, retry_after_s=2.0, stream_handler=stream_handler, admission=admission)
    try:
        with serve_in_thread(app) as url:
            yield url, aengine
    finally:
        aengine.shutdown()


def _wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _stub_guard(what: str, fn: Callable, kind: str, *args: Any) -> None:
    """The released stub (`raise NotImplementedError()` in an `async def` without `yield`) is a coroutine function,
    not an async generator: report 'not implemented yet', or for any other such function that it needs `yield`.
    Anything else (an async generator function, a class, a function returning an async iterator) goes on."""
    if not callable(fn):
        raise AssertionError(f"{what}: expected your function, got {fn!r}")
    raw = inspect.unwrap(fn)
    if inspect.iscoroutinefunction(raw) and not inspect.isasyncgenfunction(raw):
        call_learner(what, lambda: run_sync(raw(*args)))
        raise AssertionError(f"{what} must be {kind}: an `async def` with `yield` in it, got a plain coroutine")





def observe_where(fn: Any, observe: Callable[..., dict], *args: Any, watch: tuple = (), what: str = "") -> dict:
    """observe(*args), run where the learner's `fn` lives: here, or in the notebook's kernel when `fn` is a Remote
    (its servers and threads call `fn` at once, which one connection to the judge cannot serve). `observe` only
    collects what happened, as data; the check decides. Calls into `watch` (the references) are refused there."""
    seen = run_where(fn, _observe_watched, observe, *args, watch=tuple(watch), what=what)
    if not isinstance(seen, dict):
        raise AssertionError(f"{what}: the grader's scenario reported {type(seen).__name__}, not what happened (was it "
                             "replaced in the notebook?)")
    return seen


def _observe_watched(observe: Callable[..., dict], *args: Any, watch: tuple = (), what: str = "") -> dict:
    with quiet(), no_calls_into(*watch, what=what) if watch else nullcontext():
        return observe(*args)


def one_call_at_a_time(fn: Callable) -> Callable:
    """fn, its calls serialised: an engine's or a router's thread may call the learner's function while another
    waits, and a judged function (a Remote) answers one call at a time over its one connection."""
    lock = threading.Lock()

    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return fn(*args, **kwargs)
    return call
