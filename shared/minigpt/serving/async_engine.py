"""The async engine (lab 08): either engine's step loop in ONE background thread, streams per request.

    aengine = AsyncLLMEngine(LLMEngine.from_checkpoint("target")); aengine.start()
    stream = aengine.stream("r1", prompt_ids, max_tokens=32, sampling=SamplingParams())   # ValueError if invalid
    async for out in stream:              # RequestOutputs of this request only, the last one has finished=True
        print(out.text, end="")
    await aengine.abort("r1")             # frees its blocks at the engine thread's next iteration
    aengine.shutdown()                    # aborts what is left, joins the thread

Why a thread: a model step takes milliseconds to a second on a CPU; running it in the event loop would
freeze every HTTP connection meanwhile. PyTorch releases the GIL inside its kernels, so the loop stays
responsive while the thread computes. Only the engine thread touches the engine: the event loop hands it
requests and aborts through a queue of pending operations (never waiting for a step to end), and the
thread hands outputs back with `loop.call_soon_threadsafe` into each request's asyncio.Queue.

A stream does NOT abort its request when its consumer stops reading: whoever consumes it owns the
request and must call `abort` (the SSE handler does, in a `finally`). `pause()` / `resume()` stop and
restart the stepping (requests and aborts are still applied): a test hook to fill the queue deterministically.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Callable, Hashable, Sequence

from minigpt.sampling import SamplingParams
from minigpt.serving.base import EngineBase, Prompt
from minigpt.serving.outputs import EngineStats, RequestOutput

__all__ = ["AsyncLLMEngine", "RequestStream"]

log = logging.getLogger(__name__)
Observer = Callable[[list[RequestOutput]], None]


class RequestStream:
    """Async iterator over one request's outputs; ends after the output with finished=True."""

    def __init__(self, request_id: Hashable, loop: asyncio.AbstractEventLoop,
                 queue: asyncio.Queue | None = None) -> None:
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue() if queue is None else queue
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self.queue.get()
        self.finished = out.finished
        return out


class AsyncLLMEngine:
    """Runs `engine.step()` in a background thread while requests are unfinished (see the module docstring)."""

    def __init__(self, engine: EngineBase, *, idle_wait_s: float = 0.05, num_threads: int | None = None) -> None:
        """num_threads: torch's CPU threads inside the engine thread (None: torch's default). One thread is fastest
        for tiny models on a busy machine."""
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self.num_threads = num_threads
        self._lock = threading.Lock()                 # held by the engine thread around every engine mutation
        self._wake = threading.Event()
        self._pending: deque[tuple] = deque()         # ("add", stream, args) / ("abort", request_id, future, loop)
        self._streams: dict[Hashable, RequestStream] = {}
        self._streams_lock = threading.Lock()
        self._observers: list[Observer] = []
        self._paused = False
        self._steps_before_pause: int | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stats = engine.stats()
        self.num_step_errors = 0

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "AsyncLLMEngine":
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="minigpt-engine", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop, abort every unfinished request (their streams end), join the thread, and close the engine
        (an engine with threads of its own stops them: `LLMEngine.close`)."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the engine thread did not stop within {timeout} s")
        self._thread = None
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pause(self, after_steps: int = 0) -> None:
        """Stop stepping (test hook), now or after `after_steps` more model steps; requests are still queued
        and aborts still applied while paused."""
        self._steps_before_pause = after_steps
        self._paused = after_steps == 0

    def resume(self) -> None:
        self._steps_before_pause = None
        self._paused = False
        self._wake.set()

    @property
    def is_paused(self) -> bool:
        return self._paused

    def add_observer(self, fn: Observer) -> None:
        """`fn(outputs)` is called in the engine thread after every step (metrics); it must be quick and not raise."""
        self._observers.append(fn)

    # --- requests (call from the event loop) -------------------------------------------------------

    def stream(self, request_id: Hashable, prompt: Prompt, max_tokens: int, sampling: SamplingParams = SamplingParams(),
               *, stop: Sequence[str] = (), adapter: int = -1, queue: asyncio.Queue | None = None) -> RequestStream:
        """Queue a request and return its stream. ValueError at once (nothing queued) if the request is invalid.
        `queue`: deliver the outputs into this asyncio.Queue (shared by several requests: one merged stream)."""
        if not self.is_running:
            raise RuntimeError("the engine loop is not running; call start() first")
        stop = tuple(stop)
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
            ids = self.engine.validate(request_id, prompt, max_tokens, sampling, stop=stop, adapter=adapter)
            stream = RequestStream(request_id, asyncio.get_running_loop(), queue)
            self._streams[request_id] = stream
        self._pending.append(("add", stream, (request_id, ids, max_tokens, sampling), {"stop": stop, "adapter": adapter}))
        self._wake.set()
        return stream

    add_request = stream

    def abort_nowait(self, request_id: Hashable) -> None:
        """Ask the engine thread to abort a request (no wait; safe in a `finally` of a cancelled task)."""
        self._pending.append(("abort", request_id, None, None))
        self._wake.set()

    async def abort(self, request_id: Hashable) -> None:
        """Abort a request and wait until the engine thread has freed its blocks (harmless if already finished)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._pending.append(("abort", request_id, done, loop))      # queued before the first await: survives cancellation
        self._wake.set()
        await done

    # --- state -------------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """The snapshot taken after the engine thread's last iteration."""
        return self._stats

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # --- the engine thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        if self.num_threads is not None:
            import torch
            torch.set_num_threads(self.num_threads)
        while True:
            self._wake.clear()
            stopping = self._stopping
            busy = self._iterate(stopping)
            if stopping:
                return
            if not busy:
                self._wake.wait(self.idle_wait_s)

    def _iterate(self, stopping: bool) -> bool:
        outputs: list[RequestOutput] = []
        stepped = False
        with self._lock:
            while self._pending:
                outputs += self._apply(self._pending.popleft())
            if stopping:
                for rid in list(self._streams):
                    outputs += self._abort(rid)
            elif not self._paused and self.engine.has_unfinished():
                stepped = True
                try:
                    outputs += self.engine.step()
                    if self._steps_before_pause is not None:
                        self._steps_before_pause -= 1
                        if self._steps_before_pause <= 0:
                            self._paused, self._steps_before_pause = True, None
                except Exception:                      # never let one bad step kill the server's only engine thread
                    # The engines fail a request whose own work fails alone (inside step); an error that reaches
                    # here is the engine's own (its scheduler's state is unknown): stop everything cleanly.
                    log.exception("engine step failed outside any one request; aborting every unfinished request")
                    self.num_step_errors += 1
                    for rid in list(self._streams):
                        outputs += self._abort(rid)
            self._stats = self.engine.stats()
        if outputs:
            for fn in self._observers:
                try:
                    fn(outputs)
                except Exception:
                    log.exception("engine observer failed")
            self._deliver(outputs)
        return stepped

    def _apply(self, op: tuple) -> list[RequestOutput]:
        if op[0] == "add":
            _, stream, args, kwargs = op
            try:
                self.engine.add_request(*args, **kwargs)
            except ValueError as err:                  # validated before, so only a race: end the stream
                log.warning("request %r refused by the engine: %s", stream.request_id, err)
                return [RequestOutput(stream.request_id, [], "", True, "abort", 0, 0, error=f"refused: {err}")]
            return []
        _, request_id, done, loop = op
        outputs = self._abort(request_id)
        if done is not None:
            self._call(loop, lambda: done.done() or done.set_result(None))
        return outputs

    def _abort(self, request_id: Hashable) -> list[RequestOutput]:
        out = self.engine.abort(request_id)
        if out is None and request_id in self._streams and not self.engine.is_tracked(request_id):
            out = RequestOutput(request_id, [], "", True, "abort", 0, 0)      # its add was refused: end the stream
        return [out] if out is not None else []

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            with self._streams_lock:
                stream = self._streams.get(out.request_id)
                if stream is not None and out.finished:
                    del self._streams[out.request_id]
            if stream is not None:
                self._call(stream.loop, lambda s=stream, o=out: s.queue.put_nowait(o))

    @staticmethod
    def _call(loop: asyncio.AbstractEventLoop, fn: Callable[[], object]) -> None:
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:                           # the loop is closed: nobody is listening any more
            pass
