"""Who did what, in which order, on each side of a KV connector: a shared log of compute and transfer events.

    log = Timeline()
    runner = LoggedRunner(LayerRunner(model), log)      # embed / layer(i, x) / logits, each call logged
    channel = RecordingChannel(log)                     # send(request_id, layer, k, v), each message kept
    first = prefill_and_send(runner, prompt, channel, "req-0")
    log.kinds()    # ['embed', 'layer 0', 'send 0', 'layer 1', 'send 1', ..., 'logits']: sent as computed

    inbox = ScriptedChannel(messages, fail_at=3)        # recv(timeout_s) hands out messages; the 4th raises
    blocks = receive_kv(inbox, "req-0", n_layers, n_tokens, store)

The notebook draws these logs to show layer-wise sending against sending after the prefill; the grader gives the
same objects to a learner's producer and consumer, so the order it judges is the order it saw happen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from torch import Tensor

from minigpt.disagg.channel import KVMessage, TransferError, TransferTimeout

__all__ = ["Event", "Timeline", "LoggedRunner", "RecordingChannel", "ScriptedChannel"]


@dataclass(frozen=True)
class Event:
    """One call: its kind ("embed", "layer", "logits", "send", "recv"), the layer it concerns (or None), when."""
    kind: str
    layer: int | None
    at_s: float

    def label(self) -> str:
        return self.kind if self.layer is None else f"{self.kind} {self.layer}"


@dataclass
class Timeline:
    """Events in the order they happened, stamped with time.perf_counter() from the log's creation."""
    events: list[Event] = field(default_factory=list)
    start_s: float = field(default_factory=time.perf_counter)

    def add(self, kind: str, layer: int | None = None) -> None:
        self.events.append(Event(kind, layer, time.perf_counter() - self.start_s))

    def kinds(self) -> list[str]:
        """The events' labels in order: "layer 3", "send 3", "logits", ..."""
        return [e.label() for e in self.events]


class LoggedRunner:
    """A LayerRunner whose every call is logged: n_layers, embed(prompt), layer(i, x), logits(x)."""

    def __init__(self, runner: Any, log: Timeline) -> None:
        self._runner, self._log = runner, log

    @property
    def n_layers(self) -> int:
        return self._runner.n_layers

    def embed(self, prompt: Sequence[int]) -> Tensor:
        self._log.add("embed")
        return self._runner.embed(prompt)

    def layer(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = self._runner.layer(i, x)
        self._log.add("layer", i)
        return out

    def logits(self, x: Tensor) -> Tensor:
        self._log.add("logits")
        return self._runner.logits(x)


class RecordingChannel:
    """The producer's end of a connector that keeps what it is given: send(request_id, layer, k, v)."""

    def __init__(self, log: Timeline | None = None) -> None:
        self.log = log if log is not None else Timeline()
        self.messages: list[KVMessage] = []

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor) -> None:
        self.log.add("send", layer if isinstance(layer, int) else None)
        self.messages.append(KVMessage(request_id=request_id, layer=layer, k=k.detach().clone(),
                                       v=v.detach().clone(), src_blocks=[]))


class ScriptedChannel:
    """The consumer's end, handing out given messages one recv at a time, in the given order.

    `fail_at` = j: the j-th recv (from 0) raises TransferError (`timeout=True`: TransferTimeout), as a dropped
    connection or a peer that stopped sending would; after the messages run out, recv raises TransferTimeout.
    """

    def __init__(self, messages: Sequence[KVMessage], *, fail_at: int | None = None, timeout: bool = False,
                 log: Timeline | None = None) -> None:
        self._messages, self._fail_at, self._timeout = list(messages), fail_at, timeout
        self.log = log if log is not None else Timeline()
        self.received = 0

    def recv(self, timeout_s: float = 10.0) -> KVMessage:
        index = self.received
        self.received += 1
        self.log.add("recv", self._messages[index].layer if index < len(self._messages) else None)
        if index == self._fail_at:
            error = TransferTimeout if self._timeout else TransferError
            raise error(f"the transfer broke at message {index}: the prefill worker's connection was lost")
        if index >= len(self._messages):
            raise TransferTimeout(f"no KV message arrived within {timeout_s:g} s (all {len(self._messages)} sent "
                                  "messages were already received)")
        return self._messages[index]
