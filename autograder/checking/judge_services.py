"""What the judge's end of the wire serves the learner's kernel: nothing but these operations on these objects.

The kernel's end answers whatever the judge asks (the judge is trusted); the judge's end (`wire.Endpoint(...,
services=judge_services())`) hands out only objects whose type is listed here, and answers only what each
`Service` allows: a model may be called and its config, dtype and device read; a collective (a ring pass too) may
be called; a KV cache's layers listed, read and their length set to an int; a block manager's tables read; a block pool's references taken and dropped and its counts read, a host loader's copies started and waited for (lab 13); lab 11's
logged layer runner run, its channels sent to or received from, its decode-side block store allocated, freed and
written; lab 12's overlap driver's operations called (ids in, ids out); a `Callback` a check made on purpose may be
called. Every other request is `Refused`, and so is every
`_`-prefixed name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

__all__ = ["Refused", "Service", "Callback", "BoundService", "judge_services"]


class Refused(PermissionError):
    """The judge's end does not serve this (an object it does not hand out, or a request it does not answer)."""


@dataclasses.dataclass(frozen=True)
class Service:
    """What the other side may do with one kind of this side's objects: call it, call these methods, read these
    attributes, set these attributes (to an int), list its items (`for x in obj`, `len(obj)`, `obj[i]`)."""

    call: bool = False
    methods: frozenset[str] = frozenset()
    get: frozenset[str] = frozenset()
    set: frozenset[str] = frozenset()
    items: bool = False

    def allows(self, op: str, name: Any) -> bool:
        """Whether request `op` (on attribute or method `name`, None for a call or a listing) is served."""
        if name is not None and (not isinstance(name, str) or name.startswith("_")):
            return False
        return ((op == "call" and self.call) or (op == "method" and name in self.methods)
                or (op == "getattr" and (name in self.get or name in self.methods))
                or (op == "setattr" and name in self.set) or (op in ("iter", "len", "getitem") and self.items))


class Callback:
    """A function of the judge's that a check hands the kernel to call (a stand-in piece it must not patch, such as
    the package's hash of a block): the kernel can call it, and nothing else."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class BoundService:
    """`obj.name`, for a method a Service lists: the other side gets a handle it can only call."""

    __slots__ = ("obj", "name")

    def __init__(self, obj: Any, name: str) -> None:
        self.obj, self.name = obj, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.obj, self.name)(*args, **kwargs)


def judge_services() -> dict[type, Service]:
    """The judge's objects a learner's code may use, and how (everything else of the judge's is refused)."""
    from minigpt.cache.block_manager import BlockManager
    from minigpt.cache.block_pool import BlockPool
    from minigpt.cache.host_loader import HostLoader
    from minigpt.cache.contiguous import KVCache, LayerKVCache
    from minigpt.disagg.receiver import DecodeKVStore
    from minigpt.disagg.timeline import LoggedRunner, RecordingChannel, ScriptedChannel
    from minigpt.model import GPT
    from minigpt.parallel.comm import CountingComm
    from minigpt.serving.overlap_driver import OverlapDriver
    from minigpt.structured.regex_automaton import CountingAutomaton

    return {
        GPT: Service(call=True, methods=frozenset({"forward"}), get=frozenset({"config", "dtype", "device"})),
        CountingComm: Service(methods=frozenset({"all_reduce", "all_gather", "all_to_all", "ring_pass"}),
                              get=frozenset({"rank", "world_size"})),
        KVCache: Service(items=True, get=frozenset({"length", "max_seq_len", "batch_size"})),
        # a layer's own protocol (update) too: a model run by the learner's code writes into the judge's cache (lab 06's
        # draft head), so the judge sees every key and value written as it is written
        LayerKVCache: Service(methods=frozenset({"update"}), get=frozenset({"length", "max_seq_len", "batch_size",
                                                                           "n_kv_heads", "head_dim", "k", "v"}),
                              set=frozenset({"length"})),
        BlockManager: Service(methods=frozenset({"table", "num_tokens"}), get=frozenset({"block_size"})),
        # lab 13's radix tree takes and drops references on the judge's pool, which counts them itself
        BlockPool: Service(methods=frozenset({"incref", "free"}),
                           get=frozenset({"ref_counts", "block_size", "num_blocks"})),
        # lab 13's copies from the host tier: started and waited for; the loader logs both itself
        HostLoader: Service(methods=frozenset({"has", "load", "wait"})),
        CountingAutomaton: Service(methods=frozenset({"step", "walk", "accepting", "live", "start_state"}),
                                   get=frozenset({"start"})),
        # lab 11's ends of a connector: they take plain data and note what happened themselves, after it happened
        LoggedRunner: Service(methods=frozenset({"embed", "layer", "logits"}), get=frozenset({"n_layers"})),
        RecordingChannel: Service(methods=frozenset({"send"})),
        ScriptedChannel: Service(methods=frozenset({"recv"})),
        DecodeKVStore: Service(methods=frozenset({"allocate", "free", "write"}),
                               get=frozenset({"block_size", "n_layers", "num_free"})),
        # lab 12's engine driven one operation at a time: it records the order itself, and checks each operation
        OverlapDriver: Service(methods=frozenset({"has_unfinished", "schedule", "launch", "apply_ahead", "land",
                                                  "ready"})),
        Callback: Service(call=True),
        BoundService: Service(call=True),
    }
