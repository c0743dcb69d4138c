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

They only report. Each call takes plain data (ints, a str, a list of token ids, tensors; anything else is refused
before anything happens, so no code of the caller's runs inside the call), does its work, and only then notes what
happened, in one step that cannot fail halfway: "layer i" once layer i has run, "send i" together with the message
it carried, a delivery once a message has been handed out. A call that raises leaves no record. The grader serves
a learner's code only the calls (autograder/checking/judge_services.py), never the log or the messages: those are
the owner's to read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from minigpt.disagg.channel import KVMessage, TransferError, TransferTimeout

__all__ = ["Event", "Timeline", "LoggedRunner", "RecordingChannel", "ScriptedChannel"]

_TENSORS = (torch.Tensor, torch.nn.Parameter)      # plain tensors: never a subclass, never a proxy of another process's


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


def _plain_int(x: Any, name: str) -> int:
    """x itself when it is an int (not a bool, not a handle to someone else's object); else TypeError."""
    if type(x) is not int:
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    return x


def _plain_tensor(x: Any, name: str) -> Tensor:
    """x itself when it is a torch tensor (not a subclass, not a handle to someone else's object); else TypeError."""
    if type(x) not in _TENSORS:
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _token_ids(prompt: Any) -> list[int] | Tensor:
    """The prompt as given when it is a list or tuple of ints or a tensor; else TypeError."""
    if type(prompt) in _TENSORS:
        return prompt
    if type(prompt) not in (list, tuple) or any(type(t) is not int for t in prompt):
        raise TypeError(f"the prompt must be a list of token ids (ints), got {type(prompt).__name__}")
    return list(prompt)


class LoggedRunner:
    """A LayerRunner whose every call is logged once it has run: n_layers, embed(prompt), layer(i, x), logits(x)."""

    def __init__(self, runner: Any, log: Timeline) -> None:
        self._runner, self._log = runner, log

    @property
    def n_layers(self) -> int:
        return self._runner.n_layers

    def embed(self, prompt: Sequence[int]) -> Tensor:
        x = self._runner.embed(_token_ids(prompt))
        self._log.add("embed")
        return x

    def layer(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = self._runner.layer(_plain_int(i, "the layer index"), _plain_tensor(x, "x"))
        self._log.add("layer", i)
        return out

    def logits(self, x: Tensor) -> Tensor:
        out = self._runner.logits(_plain_tensor(x, "x"))
        self._log.add("logits")
        return out


class RecordingChannel:
    """The producer's end of a connector that keeps what it is given: send(request_id, layer, k, v).

    A send is noted ("send i" in the log, the message in `messages`) only once the message is whole: a request id
    (str), a layer (int >= 0), k and v tensors of one shape (T, n_kv_heads, head_dim), copied. One that is not
    raises and leaves no trace, so every "send i" in the log has its message, and the other way round.
    """

    def __init__(self, log: Timeline | None = None) -> None:
        self.log = log if log is not None else Timeline()
        self.messages: list[KVMessage] = []

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor) -> None:
        if type(request_id) is not str:
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        layer, k, v = _plain_int(layer, "layer"), _plain_tensor(k, "k"), _plain_tensor(v, "v")
        if layer < 0 or k.ndim != 3 or k.shape != v.shape:
            raise ValueError(f"send(request_id, layer, k, v): a layer >= 0 and k, v both (T, n_kv_heads, head_dim); "
                             f"got layer {layer}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        message = KVMessage(request_id=request_id, layer=layer, k=k.detach().clone(), v=v.detach().clone(),
                            src_blocks=[])
        self.messages.append(message)
        self.log.add("send", layer)


class ScriptedChannel:
    """The consumer's end, handing out given messages one recv at a time, in the given order.

    `fail_at` = j: the j-th recv (from 0) raises TransferError (`timeout=True`: TransferTimeout), as a dropped
    connection or a peer that stopped sending would; after the messages run out, recv raises TransferTimeout.
    `received` counts the recv calls (each is logged, "recv i" or "recv" when none was handed out); `delivered`
    the messages actually handed out; `untimed` the recv calls made with timeout_s=None (on a real link, a recv
    that waits for a lost message for ever: here it raises TransferTimeout like the others, and the count says so).
    """

    def __init__(self, messages: Sequence[KVMessage], *, fail_at: int | None = None, timeout: bool = False,
                 log: Timeline | None = None) -> None:
        self._messages, self._fail_at, self._timeout = list(messages), fail_at, timeout
        self.log = log if log is not None else Timeline()
        self.received = 0
        self.delivered = 0
        self.untimed = 0

    def recv(self, timeout_s: float = 10.0) -> KVMessage:
        if timeout_s is not None and type(timeout_s) not in (int, float):
            raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
        self.untimed += timeout_s is None
        index = self.received
        self.received += 1
        self.log.add("recv", self._messages[index].layer if index < len(self._messages) else None)
        if index == self._fail_at:
            error = TransferTimeout if self._timeout else TransferError
            raise error(f"the transfer broke at message {index}: the prefill worker's connection was lost")
        if index >= len(self._messages):
            waited = "" if timeout_s is None else f" within {timeout_s:g} s"
            raise TransferTimeout(f"no KV message arrived{waited} (all {len(self._messages)} sent messages were "
                                  "already received)")
        self.delivered += 1
        return self._messages[index]
