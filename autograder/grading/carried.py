"""Code a cell carries without writing it: what the similarity report lists as "carried code".

A learner's answer is text the report can fingerprint; code brought in some other way is not. `findings(source)`
lists what brings it in: code objects and their parts (`types.FunctionType`, `CodeType`, `__code__`, `co_code`),
`exec`/`eval`/`compile`/`__import__`, serialised or encoded data (`marshal`, `pickle` and kin, `base64`, `binascii`,
`zlib`, `lzma`, `bz2`, `gzip`, `codecs`, `bytes.fromhex`), imports behind the import system's back (`importlib`,
`runpy`, `zipimport`, `sys.modules`, `sys.path`), IPython running other code (`%run`, `%load`, `%%writefile`, shell
escapes, `get_ipython().run_cell`) and blobs. Every string, bytes or list of bytes of BLOB_CHARS or more (and
the cell's strings joined, for a blob cut in pieces) is decoded, up to LAYERS steps (base64, base85, base32, hex,
rot13, zlib, gzip, raw deflate, lzma, bz2), bounded, and never run or unmarshalled; it is a blob when a layer holds
the bytecode of one of the package's functions (the finding names it), is marshalled code, a pickle, Python source
that had to be decoded, or what a checked decompression gave; or when it is OPAQUE_CHARS long without words.
`hidden_sources(source)` gives the Python source a cell carries in its strings, plain or encoded, for the report to
fingerprint as if it were written.
"""

from __future__ import annotations

import ast
import base64
import binascii
import bz2
import codecs
import functools
import lzma
import re
import zlib
from dataclasses import dataclass

from autograder.grading import normal_form, package_index

MODULES = {"marshal", "pickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "copyreg", "base64", "binascii",
           "zlib", "lzma", "bz2", "gzip", "zipfile", "codecs", "importlib", "imp", "runpy", "zipimport", "pkgutil",
           "ctypes", "builtins", "code", "codeop"}
MODULE_NAMES = {"types": {"FunctionType", "CodeType", "LambdaType", "MethodType"}}
BUILTINS = {"exec", "eval", "compile", "__import__", "__builtins__"}
ATTRIBUTES = {"__code__", "__globals__", "__closure__", "__builtins__", "__subclasses__", "__loader__", "co_code",
              "co_consts", "f_globals", "f_locals", "f_back", "f_code", "fromhex"}
SYS_ATTRIBUTES = {"modules", "path", "meta_path", "path_hooks", "_getframe"}
MAGICS = {"run", "load", "loadpy", "load_ext", "reload_ext", "writefile", "file", "script", "bash", "sh", "system",
          "sx", "macro", "recall", "rerun", "store", "aimport", "autoreload", "python", "python3", "pypy", "perl",
          "ruby", "js", "javascript", "notebook"}
SHELL_METHODS = {"run_cell", "run_cell_async", "run_code", "run_ast_nodes", "ex", "ev", "safe_execfile",
                 "safe_run_module", "system", "system_piped", "system_raw", "getoutput", "push", "user_ns",
                 "extension_manager", "magics_manager", "define_macro"}

BLOB_CHARS = 64            # strings and bytes this long are decoded, to see what they hold
OPAQUE_CHARS = 512         # a string or bytes this long without words is reported whatever it holds
LAYERS = 3                 # decodings tried one after another (base64 of zlib of marshal: 2)
MAX_DECODED = 4 << 20      # bytes a decoding may produce
MAX_LAYERS = 16            # decoded layers kept per blob
MAX_SEARCHED = 1 << 20     # bytes of a layer searched for the package's bytecode
BYTECODE_KEY = 16          # bytes of a function's bytecode looked for first (its start), before all of it


@dataclass(frozen=True)
class Carried:
    """What carries code into a cell, and where."""
    what: str
    line: int
    reference: str = ""    # the package function whose bytecode a blob holds, if any


def _strings(tree: ast.AST) -> list[tuple[str | bytes, int]]:
    """String and bytes constants with their lines, and lists of small ints read as bytes, in source order."""
    out: list[tuple[int, int, str | bytes]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            out.append((node.lineno, node.col_offset, node.value))
        elif isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= BLOB_CHARS and all(
                isinstance(e, ast.Constant) and type(e.value) is int and 0 <= e.value < 256 for e in node.elts):
            out.append((node.lineno, node.col_offset, bytes(e.value for e in node.elts)))
    return [(value, line) for line, _, value in sorted(out, key=lambda s: s[:2])]


def _as_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("latin-1")     # "\x63\x6f..." escapes are bytes written as a string
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace")


def _opaque(value: str | bytes) -> bool:
    """Long data with no words in it: OPAQUE_CHARS or more, whose runs without whitespace average 40 or more."""
    if isinstance(value, bytes):
        return len(value) >= OPAQUE_CHARS
    return len(value) >= OPAQUE_CHARS and len(re.sub(r"\s+", "", value)) >= 40 * len(value.split())


def _decodings(data: bytes) -> list[tuple[str, bytes, bool]]:
    """(step, what data decodes or decompresses to, whether the step checked its input) for each step that
    applies (each output bounded by MAX_DECODED)."""
    out = []
    compact = re.sub(rb"\s+", b"", data)
    if re.fullmatch(rb"[A-Za-z0-9+/=_-]{16,}", compact):
        for step, altchars in (("base64", None), ("urlsafe base64", b"-_")):
            try:
                out.append((step, base64.b64decode(compact + b"=" * (-len(compact) % 4), altchars, validate=True),
                            False))
            except (binascii.Error, ValueError):
                pass
    if re.fullmatch(rb"(?:[0-9a-fA-F]{2})+", compact):
        out.append(("hex", bytes.fromhex(compact.decode()), False))
    for step, decode in (("base85", base64.b85decode), ("ascii85", base64.a85decode), ("base32", base64.b32decode)):
        try:
            out.append((step, decode(compact), False))
        except (ValueError, binascii.Error):
            pass
    try:
        out.append(("rot13", codecs.encode(data.decode("ascii"), "rot13").encode(), False))
    except UnicodeDecodeError:
        pass
    for step, wbits in (("zlib", 15), ("gzip", 31), ("raw deflate", -15)):
        try:
            unpacker = zlib.decompressobj(wbits)
            out.append((step, unpacker.decompress(data, MAX_DECODED), unpacker.eof and wbits > 0))
        except zlib.error:
            pass
    for step, make in (("lzma", lzma.LZMADecompressor), ("bz2", bz2.BZ2Decompressor)):
        try:
            unpacker = make()
            out.append((step, unpacker.decompress(data, MAX_DECODED), unpacker.eof))
        except (lzma.LZMAError, OSError, ValueError, EOFError):
            pass
    return [(step, d, checked) for step, d, checked in out if d and d != data]


def _layers(data: bytes) -> list[tuple[tuple[str, ...], bytes, bool]]:
    """(steps, layer, whether a step checked its input) for data and everything it decodes to, up to LAYERS
    steps deep and MAX_LAYERS layers."""
    seen = {data}
    out, todo = [((), data, False)], [((), data, False)]
    while todo:
        steps, blob, checked = todo.pop(0)
        if len(steps) < LAYERS:
            for step, decoded, verified in _decodings(blob):
                if decoded not in seen and len(out) < MAX_LAYERS:
                    seen.add(decoded)
                    out.append((steps + (step,), decoded, checked or verified))
                    todo.append(out[-1])
    return out


@functools.lru_cache(maxsize=1)
def _bytecode_by_start() -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for code in package_index.bytecode():
        out.setdefault(code[:BYTECODE_KEY], []).append(code)
    return out


def _bytecode_in(data: bytes) -> str:
    """The dotted name of a package function whose bytecode lies in data, or ''."""
    if len(data) > MAX_SEARCHED or b"\x00" not in data:      # bytecode always holds zero bytes; text never does
        return ""
    by_start = _bytecode_by_start()
    for i in range(len(data) - BYTECODE_KEY + 1):
        for code in by_start.get(data[i:i + BYTECODE_KEY], ()):
            if data.startswith(code, i):
                return package_index.bytecode()[code]
    return ""


def _python(data: bytes) -> str | None:
    """data as Python source with at least one statement that does something, or None."""
    try:
        text = data.decode("utf-8")
        return text if normal_form.without_no_ops(ast.parse(text)).body else None
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _kind(data: bytes, decoded: bool, checked: bool) -> str:
    """What a layer recognisably is ('' if nothing): code as marshal or pickle writes it, Python source that had
    to be decoded, or data a checked decompression produced."""
    if data[:1] == b"\xe3":
        return "marshalled code"
    if len(data) > 1 and data[0] == 0x80 and 2 <= data[1] <= 5:
        return "a pickle"
    if decoded and _python(data) is not None:
        return "Python source"
    return "compressed data" if checked else ""


def _blob_finding(value: str | bytes, line: int) -> Carried | None:
    """A finding for a string or bytes that holds code (the package's bytecode named), or is opaque; else None."""
    size = f"{len(value):,} {'bytes' if isinstance(value, bytes) else 'characters'}"
    layers = _layers(_as_bytes(value))
    for steps, data, _ in layers:
        reference = _bytecode_in(data)
        if reference:
            return Carried(f"a blob of {size}: {' -> '.join(steps + (f'the bytecode of {reference}',))}", line,
                           reference)
    for steps, data, checked in layers:
        kind = _kind(data, bool(steps), checked)
        if kind:
            return Carried(f"a blob of {size}: {' -> '.join(steps + (kind,))}", line)
    return Carried(f"an opaque blob of {size}", line) if _opaque(value) else None


def _call_name(node: ast.Call) -> str:
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else ""


def _imports(tree: ast.AST) -> tuple[list[Carried], dict[str, str]]:
    """Imports that bring code in, and {name an import binds: the module it names}."""
    out: list[Carried] = []
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                imported[alias.asname or top] = top
                if top in MODULES:
                    out.append(Carried(f"import {alias.name}", node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module:
            top, names = node.module.split(".")[0], sorted(a.name for a in node.names)
            if top in MODULES:
                out.append(Carried(f"from {node.module} import {', '.join(names)}", node.lineno))
            elif set(names) & MODULE_NAMES.get(top, set()):
                kept = sorted(set(names) & MODULE_NAMES[top])
                out.append(Carried(f"from {top} import {', '.join(kept)}", node.lineno))
    return out, imported


def _attribute_use(node: ast.Attribute, imported: dict[str, str]) -> str | None:
    owner = imported.get(node.value.id, node.value.id) if isinstance(node.value, ast.Name) else ""
    if node.attr in ATTRIBUTES:
        return f".{node.attr}"
    if node.attr in MODULE_NAMES.get(owner, set()):
        return f"{owner}.{node.attr}"
    if owner == "sys" and node.attr in SYS_ATTRIBUTES:
        return f"sys.{node.attr}"
    if node.attr in SHELL_METHODS and isinstance(node.value, ast.Call) and _call_name(node.value) == "get_ipython":
        return "a shell escape (!)" if node.attr in ("system", "getoutput") else f"get_ipython().{node.attr}"
    return None


def _call_use(node: ast.Call) -> str | None:
    name = _call_name(node)
    first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
    if name in ("run_line_magic", "run_cell_magic") and (not isinstance(first, str) or first in MAGICS):
        return f"IPython magic %{first if isinstance(first, str) else '?'}"
    second = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
    if name in ("getattr", "setattr", "hasattr") and isinstance(second, str) and second in ATTRIBUTES | BUILTINS:
        return f"{name}(..., {second!r})"
    return None


def _constructs(tree: ast.AST) -> list[Carried]:
    """Imports, names, attributes and calls (IPython's among them) that bring code in."""
    out, imported = _imports(tree)
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Name) and node.id in BUILTINS and not isinstance(node.ctx, ast.Store):
            what = node.id
        elif isinstance(node, ast.Attribute):
            what = _attribute_use(node, imported)
        elif isinstance(node, ast.Call):
            what = _call_use(node)
        if what is not None:
            out.append(Carried(what, node.lineno))
    return out


def findings(source: str) -> list[Carried]:
    """What in this cell carries code (see the module's docstring), each once: blobs that name a function of the
    package first, then in line order."""
    tree = normal_form.parse(source)
    if tree is None:
        words = set(re.findall(r"\w+", source))
        return [Carried(f"{word} (in a cell that does not parse)", 1)
                for word in sorted(words & (MODULES | BUILTINS | ATTRIBUTES))]
    out = _constructs(tree)
    strings = _strings(tree)
    blobs = [found for value, line in strings if len(value) >= BLOB_CHARS
             if (found := _blob_finding(value, line)) is not None]
    joined = "".join(v for v, _ in strings if isinstance(v, str))
    if not blobs and len(strings) > 1 and len(joined) >= BLOB_CHARS:
        found = _blob_finding(joined, strings[0][1])                  # a blob split into short strings
        blobs += [found] if found is not None and not found.what.startswith("an opaque") else []
    unique = {(c.what, c.line): c for c in out + blobs}
    return sorted(unique.values(), key=lambda c: (not c.reference, c.line, c.what))


def hidden_sources(source: str) -> list[tuple[str, int]]:
    """Python source carried in the cell's strings, as written or encoded (to be exec'd, compiled or written to a
    file), each with the line of its string."""
    tree = normal_form.parse(source)
    if tree is None:
        return []
    out: dict[str, int] = {}
    strings = _strings(tree)
    joined = "".join(v for v, _ in strings if isinstance(v, str))
    for value, line in strings + ([(joined, strings[0][1])] if len(strings) > 1 else []):
        data = _as_bytes(value)
        for _, layer, _ in _layers(data) if len(value) >= BLOB_CHARS else [((), data, False)]:
            text = _python(layer)
            if text is not None:
                out.setdefault(text, line)
    return list(out.items())


def file_finding(name: str, data: bytes) -> Carried:
    """A file handed in beside the notebook (a cell can import, read or exec it), with what it holds if a blob
    would say (the package's bytecode named)."""
    found = _blob_finding(data[:MAX_DECODED], 1)
    held = f" holding {found.what[found.what.index(':') + 2:]}" if found is not None and ":" in found.what else ""
    return Carried(f"a file beside the notebook: {name} ({len(data):,} bytes){held}", 1,
                   found.reference if found is not None else "")
