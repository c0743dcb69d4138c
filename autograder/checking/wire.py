"""The wire between the learner's kernel (observe) and the judge: values as data, everything else as a handle.

One Unix socket, one conversation at a time, calls nested both ways:

    judge                                   kernel (learner's code)
    fn = endpoint.request("getname", name="kv_cache_bytes")   -> Remote(handle 1)
    fn(shape, 2)          --- call 1 (shape, 2) ------------>  kv_cache_bytes(shape, 2)
                          <-- value 4096 --------------------
    generate(model, ids)  --- call 2 (Remote(judge's model)) -> generate(proxy, ids)
                          <-- call model(ids) ---------------  proxy(ids) asks the judge
                          --- value logits ----------------->
                          <-- value tokens ------------------

Frames (a JSON header and a safetensors blob, never pickle; bounded in size and nesting) are
autograder/checking/framing.py's. What travels by value: None, bool, int, float, str, bytes, tuple/list/dict/set of these, torch
tensors (dtype, shape and requires_grad kept; on the CPU), dtypes, devices, sizes, slices, ranges, numpy
scalars, and dataclasses and enums of the course's own package. Anything else (a function, a class, an
instance, a generator) travels as a handle and arrives as a `Remote`: calling it, reading or setting an
attribute, indexing, len() or iterating it asks the other side. An exception comes back as its type name and
message: builtins and the course's own exception types are raised as themselves, anything else as
`RemoteError`. A tensor handed to a call by value is copied back into the caller's tensor if the call
changed it (a kernel that writes into its output, an in-place cache update); a torch.Generator travels by value
and comes back in the state the call left it in; torch's global RNG state goes with every call and comes back,
so `torch.manual_seed(0)` before a judged call seeds the learner's draws as it would in one process. A tensor
on the meta device travels as its shape and dtype (it holds no data).

Decoding never runs the sender's code: it builds plain values, tensors, and instances of the course
package's dataclasses, enums and exceptions (looked up by module name under `minigpt.` or `autograder.`).

The two ends are not alike. The kernel's end answers whatever the judge asks (the judge is trusted). The judge's
end serves only what autograder/checking/judge_services.py lists: any other object of the judge's is refused before it is
sent (a check that tried would fail, not leak), and any other request is refused when it arrives (no attribute
outside the list, no `_` name, no `getname`, `package`, `type` or `vars`); it decodes no module and none of the
grader's own objects or exception types. So learner code can make the judge run only the model, collective and
cache code the list names, on data it sends.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import socket
import types
from pathlib import Path
from typing import Any, Callable

import torch

from autograder.checking.framing import (MAX_DEPTH, MAX_FRAME_BYTES, MAX_HEADER_BYTES, MAX_ITEMS, ChannelClosed, recv_frame,
                                send_frame)
from autograder.checking.judge_services import BoundService, Callback, Refused, Service, judge_services
from autograder.paths import AUTOGRADER_DIR, SHARED_DIR
from autograder.checking.remote import (IN_KERNEL_CHECKS, Remote, class_of, del_attribute, held_where, in_kernel,
                                        is_class, is_remote, path_of, run_where, vars_of)

__all__ = ["Endpoint", "Remote", "RemoteError", "ChannelClosed", "Refused", "Service", "Callback", "judge_services",
           "trusted_object", "send_frame", "recv_frame", "path_of", "is_remote", "is_class",
           "class_of", "vars_of", "run_where", "held_where", "in_kernel", "storage_address"]

TRUSTED_PREFIXES = ("minigpt.", "autograder.")


class RemoteError(Exception):
    """An exception of a type only the other side knows (e.g. one the learner defined)."""


def trusted_object(path: str) -> Any:
    """The object at "module:qualname" when the module belongs to the course's package; else ValueError."""
    module, _, qualname = path.partition(":")
    if (not module.startswith(TRUSTED_PREFIXES) and module not in ("minigpt", "autograder")) or "__main__" in module:
        raise ValueError(f"not a course object: {path!r}")      # (importing a __main__ would run a command)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _kind(obj: Any) -> str:
    if isinstance(obj, type):
        return "class"
    if callable(obj):
        return "function"
    return "object"


# ----------------------------------------------------------------------------- the endpoint

class Endpoint:
    """One side of the conversation: sends requests, answers the other side's, keeps this side's handles.

    `names` answers "getname" (the kernel's user namespace); `on_call` wraps every local call the other side
    asks for (the kernel traces or watches the learner's code there when the judge asks it to). `services` makes
    this end serve nothing else (the judge's): only objects of those types are handed out, only as each Service
    says; every other object and request is `Refused`.
    """

    def __init__(self, sock: socket.socket, *, names: dict[str, Any] | None = None,
                 on_call: Callable[[Callable[[], Any], dict], tuple[Any, dict]] | None = None,
                 services: dict[type, Service] | None = None) -> None:
        self.sock = sock
        self.names = names
        self.on_call = on_call
        self.services = services
        self._objects: dict[int, Any] = {}          # handle -> local object the other side holds
        self._handles: dict[int, int] = {}          # id(local object) -> handle
        self._remotes: dict[int, Remote] = {}       # handle -> proxy of the other side's object
        self.call_options: Callable[[], dict] = dict   # extra options sent with each call (judge: traces, watches)
        self.on_reply: Callable[[dict], None] = lambda extra: None
        self.describe_error: Callable[[BaseException], list[str]] | None = None   # the kernel: the learner's frames

    # -- requests this side makes

    def request(self, op: str, **payload: Any) -> Any:
        tensors: dict[str, torch.Tensor] = {}
        sent: list[torch.Tensor] = []
        if op == "call":
            payload["opts"] = self.call_options()
        body = {k: self._encode(v, tensors, sent) for k, v in payload.items()}
        if op in ("call", "method"):
            tensors["rng"] = torch.get_rng_state()     # torch's global RNG goes with the call, and comes back
        send_frame(self.sock, {"op": op, **body}, tensors)
        while True:
            header, blob = recv_frame(self.sock)
            if "op" in header:
                self._answer(header, blob)
                continue
            if "raise" in header:
                raise self._exception(header["raise"])
            with torch.no_grad():
                for index, key in header.get("changed", {}).items():
                    _write_back(sent[int(index)], blob[key])
            if "rng" in blob:
                torch.set_rng_state(blob["rng"])
            if header.get("extra"):
                self.on_reply(header["extra"])
            return self._decode(header.get("value"), blob)

    def hello(self, token: str) -> None:
        """The first frame of a conversation: which request it answers."""
        send_frame(self.sock, {"hello": token}, {})

    def expect_hello(self) -> str:
        header, _ = recv_frame(self.sock)
        return str(header.get("hello", ""))

    def finish(self, **payload: Any) -> None:
        """Tell the other side the conversation is over (it returns from `serve`)."""
        tensors: dict[str, torch.Tensor] = {}
        send_frame(self.sock, {"op": "done", **{k: self._encode(v, tensors, []) for k, v in payload.items()}},
                    tensors)

    def serve(self) -> dict:
        """Answer requests until the other side says "done"; returns what it sent with it (decoded)."""
        while True:
            header, blob = recv_frame(self.sock)
            if header.get("op") == "done":
                return {k: self._decode(v, blob) for k, v in header.items() if k != "op"}
            self._answer(header, blob)

    # -- answering the other side

    def _answer(self, header: dict, blob: dict[str, torch.Tensor]) -> None:
        tensors: dict[str, torch.Tensor] = {}
        received: list[torch.Tensor] = []
        try:
            args = {k: self._decode(v, blob, received) for k, v in header.items() if k not in ("op", "opts")}
            before = [_snapshot(t) for t in received]
            opts = self._decode(header.get("opts"), blob) or {}      # sent encoded, like every value
            if self.services is not None:       # the judge's end: its RNG is its own, the caller's goes back as it came
                value, extra = self._served(header["op"], args)
                if "rng" in blob:
                    tensors["rng"] = blob["rng"]
            else:
                if "rng" in blob:
                    torch.set_rng_state(blob["rng"])
                value, extra = self._perform(header["op"], args, opts)
                if "rng" in blob:
                    tensors["rng"] = torch.get_rng_state()
            changed = {}
            for i, (old, new) in enumerate(zip(before, received)):
                now = _snapshot(new)
                if old.shape != now.shape or old.dtype != now.dtype or not torch.equal(old, now):
                    changed[str(i)] = f"w{i}"
                    tensors[f"w{i}"] = now.cpu().contiguous().clone()
            reply = {"value": self._encode(value, tensors, []), "changed": changed, "extra": extra}
        except BaseException as err:      # noqa: BLE001  (the other side gets every error, KeyboardInterrupt too)
            if isinstance(err, (KeyboardInterrupt, SystemExit, ChannelClosed)):
                raise
            tensors = {}
            message = str(err)
            if isinstance(err, NotImplementedError) and not message and header.get("op") == "call":
                name = getattr(self._objects.get(header.get("h")), "__name__", None)
                message = f"`{name}` still raises NotImplementedError" if name else ""
            reply = {"raise": {"type": path_of(type(err)) if type(err).__module__ != "builtins" else type(err).__name__,
                               "message": message[:2000], "name": type(err).__name__,
                               "frames": self.describe_error(err) if self.describe_error else []}}
        send_frame(self.sock, reply, tensors)

    def _served(self, op: str, a: dict) -> tuple[Any, dict]:
        """A request to the judge's end: only what `services` lists, on the objects it handed out."""
        obj = self._objects.get(a.get("h")) if "h" in a else None
        name = a.get("name")
        service = self.services.get(type(obj)) if obj is not None else None
        if service is None or not service.allows(op, name):
            what = f"{op} {name!r}" if name is not None else op
            raise Refused(f"the grader does not answer {what}" + (f" on its {type(obj).__name__}" if obj is not None
                          else "") + "; its objects only answer what a check needs of them (a model: model(...), "
                          ".forward(...), .config, .dtype, .device)")
        if op == "getattr" and name in service.methods:
            return BoundService(obj, name), {}
        if op == "setattr" and type(a["value"]) is not int:
            raise Refused(f"the grader's {type(obj).__name__}.{name} takes an int, not {type(a['value']).__name__}")
        if op == "iter":
            return list(obj), {}
        if op == "call":
            return obj(*a["args"], **a["kwargs"]), {}
        return self._perform(op, a, {})

    def _perform(self, op: str, a: dict, opts: dict) -> tuple[Any, dict]:
        if op == "getname":
            if self.names is None or a["name"] not in self.names:
                raise NameError(f"name {a['name']!r} is not defined")
            return self.names[a["name"]], {}
        obj = self._objects[a["h"]] if "h" in a else None
        if op == "call":
            call = lambda: obj(*a["args"], **a["kwargs"])          # noqa: E731
            return self.on_call(call, opts) if self.on_call else (call(), {})
        if op == "method":
            return getattr(obj, a["name"])(*a["args"], **a["kwargs"]), {}
        if op == "getattr":
            return getattr(obj, a["name"]), {}
        if op == "setattr":
            setattr(obj, a["name"], a["value"])
            return None, {}
        if op == "getitem":
            return obj[a["key"]], {}
        if op == "setitem":
            obj[a["key"]] = a["value"]
            return None, {}
        simple = {"len": len, "iter": iter, "next": next, "bool": bool, "repr": repr}
        if op in simple:
            return simple[op](obj), {}
        if op == "contains":
            return a["item"] in obj, {}
        if op == "package":                  # a function of the course's package, run on this side
            value = trusted_object(a["path"])(*a["args"], **a["kwargs"])
            return (_Held(value) if a.get("hold") else value), {}
        if op == "type":
            return type(obj), {}
        if op == "vars":
            return dict(vars(obj)), {}
        if op == "delattr":
            delattr(obj, a["name"])
            return None, {}
        raise ValueError(f"unknown request {op!r}")

    # -- values

    def _handle_of(self, obj: Any) -> int:
        key = id(obj)
        if key not in self._handles:
            handle = len(self._objects) + 1
            self._objects[handle] = obj
            self._handles[key] = handle
        return self._handles[key]

    def _encode(self, x: Any, tensors: dict[str, torch.Tensor], sent: list[torch.Tensor]) -> Any:
        with torch._C.DisableTorchFunction():        # the judge's own tensor traces must not see the wire
            return self._encode_value(x, tensors, sent)

    def _encode_value(self, x: Any, tensors: dict, sent: list) -> Any:
        enc = lambda v: self._encode_value(v, tensors, sent)       # noqa: E731
        if x is None or isinstance(x, (bool, str)) and type(x) in (bool, str):
            return x
        if type(x) is int:
            return x
        if type(x) is float:
            return {"f": repr(x)} if x != x or x in (float("inf"), float("-inf")) else x
        if isinstance(x, torch.Tensor) and type(x) in (torch.Tensor, torch.nn.Parameter) and x.is_meta:
            return {"meta": list(x.shape), "dt": str(x.dtype).removeprefix("torch."), "grad": bool(x.requires_grad)}
        if isinstance(x, torch.Tensor) and type(x) in (torch.Tensor, torch.nn.Parameter):
            key = f"t{len(tensors)}"
            tensors[key] = x.detach().cpu().contiguous().clone()
            sent.append(x)
            return {"T": key, "grad": bool(x.requires_grad), "device": str(x.device),
                    "param": isinstance(x, torch.nn.Parameter), "storage": storage_address(x)}
        if isinstance(x, Remote) and x._endpoint is self:
            return {"yours": x._handle}
        if type(x) is _Held:                    # kept on this side: the other gets a handle (remote.held_where)
            return {"mine": self._handle_of(x.value), "kind": _kind(x.value)}
        if isinstance(x, torch.Generator):      # by value; the state it ends in comes back (a sampler drew from it)
            key = f"t{len(tensors)}"
            tensors[key] = x.get_state()
            sent.append(x)
            return {"gen": key, "device": str(x.device)}
        if isinstance(x, tuple) and type(x) is tuple:
            return {"tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return {"list": [enc(v) for v in x]}
        if isinstance(x, dict):
            return {"dict": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, (set, frozenset)):
            return {"set": [enc(v) for v in x], "frozen": isinstance(x, frozenset)}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"device": str(x)}
        if isinstance(x, torch.Size):
            return {"size": list(x)}
        if isinstance(x, slice):
            return {"slice": [enc(x.start), enc(x.stop), enc(x.step)]}
        if isinstance(x, range):
            return {"range": [x.start, x.stop, x.step]}
        if x is Ellipsis:
            return {"ellipsis": True}
        if isinstance(x, bytes):
            return {"bytes": base64.b64encode(x).decode()}
        if isinstance(x, complex):
            return {"complex": [x.real, x.imag]}
        if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
            return enc(x.item())
        if isinstance(x, types.ModuleType) and x.__name__ != "__main__":
            return {"module": x.__name__}
        if isinstance(x, (type, types.FunctionType, types.MethodType)) and _is_course_object(x):
            return {"obj": path_of(x)}        # a class's classmethod (WeightOnlyLinear.from_weight) too
        kind = type(x)
        if kind.__module__.startswith(TRUSTED_PREFIXES):
            if isinstance(x, enum.Enum):
                return {"enum": path_of(kind), "name": x.name}
            if dataclasses.is_dataclass(x) and not isinstance(x, type):
                return {"dc": path_of(kind), "fields": {f.name: enc(getattr(x, f.name))
                                                        for f in dataclasses.fields(x) if hasattr(x, f.name)}}
        if isinstance(x, (int, float, str, tuple)):   # subclasses of plain values (IntEnum of a learner, a namedtuple)
            base = int if isinstance(x, int) else float if isinstance(x, float) else str if isinstance(x, str) else tuple
            return enc(base(x))
        if self.services is not None and type(x) not in self.services:
            raise Refused(f"the grader hands the notebook data, not its own {type(x).__module__}.{type(x).__qualname__} "
                          "(a check that needs to must build it where the learner's code runs: wire.run_where)")
        return {"mine": self._handle_of(x), "kind": _kind(x)}

    def _decode(self, x: Any, blob: dict[str, torch.Tensor], received: list[torch.Tensor] | None = None) -> Any:
        with torch._C.DisableTorchFunction():
            return self._decode_value(x, blob, received if received is not None else [])

    def _decode_value(self, x: Any, blob: dict, received: list) -> Any:
        dec = lambda v: self._decode_value(v, blob, received)       # noqa: E731
        if not isinstance(x, dict):
            return x
        if "T" in x:
            t = blob[x["T"]]
            if x["device"] != "cpu" and torch.device(x["device"]).type == "cuda" and torch.cuda.is_available():
                t = t.to(x["device"])
            if x.get("param"):
                t = torch.nn.Parameter(t, requires_grad=x["grad"])
            elif x["grad"]:
                t.requires_grad_(True)
            received.append(t)
            if x.get("storage"):
                _ORIGINS[t.untyped_storage().data_ptr()] = (int(x["storage"]), t)
            return t
        if "gen" in x:
            g = torch.Generator(device=x["device"] if torch.device(x["device"]).type == "cpu" or
                                torch.cuda.is_available() else "cpu")
            g.set_state(blob[x["gen"]])
            received.append(g)
            return g
        if "meta" in x:         # a tensor on the meta device has a shape and a dtype but no data to send
            dtype = getattr(torch, x["dt"])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"not a dtype: {x['dt']!r}")
            return torch.empty(x["meta"], dtype=dtype, device="meta").requires_grad_(x["grad"])
        if "f" in x:
            return float(x["f"])
        if "yours" in x:
            return self._objects[x["yours"]]
        if "mine" in x:
            handle = x["mine"]
            if handle not in self._remotes:
                self._remotes[handle] = Remote(self, handle, x.get("kind", "object"))
            return self._remotes[handle]
        if "module" in x:
            if self.services is not None:
                raise Refused(f"the grader takes no module from the notebook ({x['module']!r})")
            return installed_module(x["module"])
        if "obj" in x:
            obj = self._course_object(x["obj"])
            if self.services is not None and not _is_course_object(obj):
                raise Refused(f"not a function or class of the course: {x['obj']!r}")
            return obj
        if "tuple" in x:
            return tuple(dec(v) for v in x["tuple"])
        if "list" in x:
            return [dec(v) for v in x["list"]]
        if "dict" in x:
            return {_hashable(dec(k)): dec(v) for k, v in x["dict"]}
        if "set" in x:
            items = [_hashable(dec(v)) for v in x["set"]]
            return frozenset(items) if x["frozen"] else set(items)
        if "dtype" in x:
            dtype = getattr(torch, x["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"not a dtype: {x['dtype']!r}")
            return dtype
        if "device" in x:
            return torch.device(x["device"])
        if "size" in x:
            return torch.Size(x["size"])
        if "slice" in x:
            return slice(*(dec(v) for v in x["slice"]))
        if "range" in x:
            return range(*x["range"])
        if "ellipsis" in x:
            return Ellipsis
        if "bytes" in x:
            return base64.b64decode(x["bytes"])
        if "complex" in x:
            return complex(*x["complex"])
        if "enum" in x:
            cls = self._course_object(x["enum"])
            if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
                raise ValueError(f"not an enum: {x['enum']}")
            return cls[x["name"]]
        if "dc" in x:
            cls = self._course_object(x["dc"])
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                raise ValueError(f"not a dataclass: {x['dc']}")
            obj = object.__new__(cls)
            for name, value in x["fields"].items():
                object.__setattr__(obj, name, dec(value))
            return obj
        raise ValueError(f"cannot decode {sorted(x)}")

    def _course_object(self, path: str) -> Any:
        """trusted_object(path); the judge's end takes only the minigpt package's (never the grader's own)."""
        if self.services is not None and not _in_minigpt(path):
            raise Refused(f"the grader takes only the course package's objects from the notebook, not {path!r}")
        return trusted_object(path)

    def _exception(self, info: dict) -> BaseException:
        """The exception the other side raised, as this side's own type where it knows it."""
        name, message = info["type"], info["message"]
        if self.services is not None and ":" in name and not _in_minigpt(name):
            cls = None                         # the grader's own exception types are not the kernel's to raise
        else:
            cls = _builtin_exception(name) if ":" not in name else _course_exception(name)
        if cls is None:
            err = RemoteError(f"{info['name']}: {message}")
            err.learner_frames = [str(f) for f in info.get("frames", [])][:20]
            return err
        err = cls.__new__(cls)
        Exception.__init__(err, message)
        err.learner_frames = [str(f) for f in info.get("frames", [])][:20]
        return err


@dataclasses.dataclass(frozen=True)
class _Held:
    """A value a "package" request asked to keep on this side (`hold`): sent as a handle, not by value."""

    value: Any


def installed_module(name: str) -> types.ModuleType:
    """The module `name` if this process has imported it already or it belongs to the course's package; anything
    else is refused (importing an arbitrary installed module can run code: `idlelib.idle` opens a window), and so
    is a file beside a submission (the course's modules are found on the course's own path, not the cwd)."""
    import sys

    if name in sys.modules:
        return sys.modules[name]
    if name in ("minigpt", "autograder") or name.startswith(TRUSTED_PREFIXES):
        module = importlib.import_module(name)
        origin = Path(getattr(module, "__file__", "") or "").resolve()
        if origin.is_relative_to(AUTOGRADER_DIR) or origin.is_relative_to(SHARED_DIR):
            return module
    raise ValueError(f"the grader does not import {name!r} for a notebook (not a module it has loaded)")


_ORIGINS: dict[int, tuple[int, torch.Tensor]] = {}   # storage here -> (its address on the other side, the tensor)


def storage_address(t: torch.Tensor) -> int:
    """Where t's memory lives: for a tensor that came over the wire (or a view of one), the address on the side
    it came from. Two tensors share memory there exactly when their storage addresses are equal."""
    if t.device.type == "meta":
        return 0
    here = t.untyped_storage().data_ptr()
    return _ORIGINS[here][0] if here in _ORIGINS else here


def forget_origins() -> None:
    """Drop the storage addresses remembered for received tensors (between test cells)."""
    _ORIGINS.clear()


def _in_minigpt(path: str) -> bool:
    """Whether a "module:qualname" path names something of the minigpt package (not the grader's own)."""
    return path.partition(":")[0].split(".")[0] == "minigpt"


def _is_course_object(obj: Any) -> bool:
    """A function or class of the course's package, found again at its own path (not one that only claims it)."""
    if isinstance(obj, types.MethodType) and not isinstance(obj.__self__, type):
        return False                          # a method bound to an instance is that instance's, not the course's
    try:
        found = trusted_object(path_of(obj))
    except (ValueError, ImportError, AttributeError, TypeError):
        return False
    return found is obj or (isinstance(obj, types.MethodType) and isinstance(found, types.MethodType)
                            and found.__func__ is obj.__func__ and found.__self__ is obj.__self__)


def _builtin_exception(name: str) -> type | None:
    import builtins

    cls = getattr(builtins, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in (
        SystemExit, KeyboardInterrupt, GeneratorExit) else None


def _course_exception(path: str) -> type | None:
    try:
        cls = trusted_object(path)
    except (ValueError, ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def _hashable(x: Any) -> Any:
    return tuple(_hashable(v) for v in x) if isinstance(x, list) else x


def _snapshot(x: torch.Tensor | torch.Generator) -> torch.Tensor:
    return x.get_state() if isinstance(x, torch.Generator) else x.detach().clone()


def _write_back(target: torch.Tensor | torch.Generator, value: torch.Tensor) -> None:
    """Copy what the other side wrote into a tensor it got by value (or the state a generator it got ended in) back
    into the original."""
    if isinstance(target, torch.Generator):
        target.set_state(value)
    elif target.shape == value.shape:
        target.copy_(value.to(target.device, target.dtype))
    else:
        target.data = value.to(target.device, target.dtype)

