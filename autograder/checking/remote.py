"""A handle to an object on the other side of the wire (autograder/checking/wire.py), and what a check uses on either side.

A check receives the learner's objects as themselves (in one process: the package's tests, COURSE_JUDGE=0) or as
`Remote`s (judged: every use of one is a request to the kernel). `is_class`, `class_of`, `vars_of`, `run_where` and
`in_kernel` answer the same question in both cases.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Remote", "path_of", "is_remote", "is_class", "class_of", "vars_of", "del_attribute", "run_where",
           "held_where", "in_kernel", "IN_KERNEL_CHECKS"]


def path_of(obj: Any) -> str:
    """"module:qualname" of a function or class (how the other side finds the same object)."""
    return f"{obj.__module__}:{obj.__qualname__}"


class Remote:
    """An object that lives on the other side of an Endpoint; every use of it is a request."""

    __slots__ = ("_endpoint", "_handle", "_kind", "__weakref__")

    def __init__(self, endpoint: Any, handle: int, kind: str) -> None:     # endpoint: a wire.Endpoint
        object.__setattr__(self, "_endpoint", endpoint)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_kind", kind)        # "function", "class", "object", ... (for messages)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint.request("call", h=self._handle, args=list(args), kwargs=kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in ("__name__", "__qualname__", "__module__",
                                                                          "__doc__", "__class__"):
            raise AttributeError(name)
        return self._endpoint.request("getattr", h=self._handle, name=name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._endpoint.request("setattr", h=self._handle, name=name, value=value)

    def __getitem__(self, key: Any) -> Any:
        return self._endpoint.request("getitem", h=self._handle, key=key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._endpoint.request("setitem", h=self._handle, key=key, value=value)

    def __len__(self) -> int:
        return self._endpoint.request("len", h=self._handle)

    def __iter__(self) -> Any:
        items = self._endpoint.request("iter", h=self._handle)
        return iter(items) if isinstance(items, list) else items     # the judge's end sends the items as a list

    def __next__(self) -> Any:
        return self._endpoint.request("next", h=self._handle)

    def __contains__(self, item: Any) -> bool:
        return self._endpoint.request("contains", h=self._handle, item=item)

    def __bool__(self) -> bool:
        return self._endpoint.request("bool", h=self._handle)

    def __repr__(self) -> str:
        try:
            return self._endpoint.request("repr", h=self._handle)
        except Exception:
            return f"<remote {self._kind} #{self._handle}>"

    def __enter__(self) -> Any:
        return self._endpoint.request("method", h=self._handle, name="__enter__", args=[], kwargs={})

    def __exit__(self, *exc: Any) -> Any:
        return self._endpoint.request("method", h=self._handle, name="__exit__", args=[None, None, None], kwargs={})


def is_remote(obj: Any) -> bool:
    return isinstance(obj, Remote)


def is_class(obj: Any) -> bool:
    """isinstance(obj, type), for a Remote too."""
    return obj._kind == "class" if isinstance(obj, Remote) else isinstance(obj, type)


def class_of(obj: Any) -> Any:
    """type(obj), for a Remote too (the learner's class, as a Remote; a course class, as itself)."""
    return obj._endpoint.request("type", h=obj._handle) if isinstance(obj, Remote) else type(obj)


def vars_of(obj: Any) -> dict[str, Any]:
    """vars(obj) (a class's own attributes: its __dict__), for a Remote too."""
    return obj._endpoint.request("vars", h=obj._handle) if isinstance(obj, Remote) else dict(vars(obj))


def del_attribute(obj: Any, name: str) -> None:
    if isinstance(obj, Remote):
        obj._endpoint.request("delattr", h=obj._handle, name=name)
    else:
        delattr(obj, name)


def run_where(obj: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), run on the side where `obj` lives: here, or in the kernel when obj is a Remote (fn must
    be a function of the course's package; its arguments travel as usual). For questions about an object that
    cannot travel (a profiler's tables, an autograd graph)."""
    if isinstance(obj, Remote):
        return obj._endpoint.request("package", path=path_of(fn), args=list(args), kwargs=kwargs)
    return fn(*args, **kwargs)


def held_where(obj: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), built on the side where `obj` lives and kept there: in the kernel when obj is a Remote (fn a
    function of the course's package), which hands back a handle: a call of obj's side that takes it gets the
    object itself, not a copy sent with every call. For a large input a check passes to many calls (lab 10's
    token trie: 0.4 s to send each time). The learner's code may change that object between calls: it is only its
    input, and the check compares what comes out with what the judge computes from its own copy."""
    if isinstance(obj, Remote):
        return obj._endpoint.request("package", path=path_of(fn), args=list(args), kwargs={}, hold=True)
    return fn(*args)


def in_kernel(check: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a check that cannot judge the learner's objects from another process (ranks as threads that
    call them at once, forked gloo ranks, autograd across the learner's Function): given Remotes, the whole check
    runs in the kernel and its verdict comes back. That verdict is the kernel's, so a notebook that patches the
    check module wins it: every use is listed (`IN_KERNEL_CHECKS`) and reported to the instructor."""
    import functools

    IN_KERNEL_CHECKS.append(path_of(check))

    @functools.wraps(check)
    def judged(*args: Any, **kwargs: Any) -> Any:
        remote = next((a for a in (*args, *kwargs.values()) if isinstance(a, Remote)), None)
        if remote is None:
            return check(*args, **kwargs)
        return remote._endpoint.request("package", path=path_of(check) + ".__wrapped__", args=list(args),
                                        kwargs=kwargs)
    return judged


IN_KERNEL_CHECKS: list[str] = []
