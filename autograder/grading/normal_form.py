"""Code reduced to what it does, as a token stream: the form the similarity report fingerprints.

`tokens(source)` parses a cell (IPython syntax turned into Python first) and walks its AST in order, one token per
node, each with the source line it came from. What a copier changes without changing the code is gone:

* formatting, comments, docstrings and type annotations (the AST has none of them, or they are dropped);
* names: every name the cell binds (parameters, locals, its functions and classes) becomes V, so renaming, merging
  or splitting them changes nothing; a name an import binds becomes the imported name (`import numpy as xp` reads
  as numpy); names the cell does not bind (builtins, the setup cell's imports, the course's API) and attributes
  stay as they are, since code that runs cannot rename them;
* strings and f-strings become S (a message reworded is still the same code);
* statements without effect: `pass`, `...`, a bare constant, name, attribute or arithmetic on them, `x = x`, a
  local assigned something without effect and never read, `if True:` / `if 1:` (the body kept), `if False:` and
  `while False:` (dropped), `try:` whose handlers only pass (the body kept), `x += y` read as `x = x + y`.

A cell that does not parse falls back to its words and symbols, names kept.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

BOUND = "V"
STRING = "S"
# Nodes that add no token of their own (a name, constant or attribute is its own token).
_SILENT_NODES = (ast.expr_context, ast.Expr, ast.arguments, ast.alias, ast.withitem, ast.Name, ast.arg, ast.Constant,
                 ast.Attribute, ast.keyword, ast.JoinedStr)


@dataclass(frozen=True)
class Token:
    text: str
    line: int     # 1-based line of the source the token came from


def python_source(source: str) -> str:
    """The cell as plain Python: IPython's magics and shell escapes become the calls IPython makes for them
    (`%run x` -> get_ipython().run_line_magic('run', 'x')); a cell magic's body stays Python on its own lines."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].strip()[2:].split(maxsplit=1)
        name, rest = (magic + ["", ""])[:2] if magic else ("", "")
        head = f"get_ipython().run_cell_magic({name!r}, {rest!r}, S)"
        return head + "\n" + python_source("\n".join(lines[1:]))
    try:
        return TransformerManager().transform_cell(source)
    except Exception:        # IPython could not read it either: parse what is there
        return source


def _is_constant(node: ast.AST) -> bool | None:
    """The truth of a test made of constants only (`True`, `1`, `not 0`, `True and 1`), or None."""
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _is_constant(node.operand)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        values = [_is_constant(v) for v in node.values]
        if None in values:
            return None
        return all(values) if isinstance(node.op, ast.And) else any(values)
    return None


def _without_effect(node: ast.AST) -> bool:
    """An expression whose evaluation changes nothing: constants, names, attributes, and operators over them."""
    if isinstance(node, (ast.Constant, ast.Name, ast.Lambda)):
        return True
    if isinstance(node, ast.Attribute):
        return _without_effect(node.value)
    if isinstance(node, ast.Subscript):
        return _without_effect(node.value) and _without_effect(node.slice)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_without_effect(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is None or _without_effect(k) for k in node.keys) and all(map(_without_effect, node.values))
    if isinstance(node, ast.UnaryOp):
        return _without_effect(node.operand)
    if isinstance(node, ast.BinOp):
        return _without_effect(node.left) and _without_effect(node.right)
    if isinstance(node, ast.BoolOp):
        return all(map(_without_effect, node.values))
    if isinstance(node, ast.Compare):
        return _without_effect(node.left) and all(map(_without_effect, node.comparators))
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) or _without_effect(v.value) for v in node.values)
    return False


class _DropNoOps(ast.NodeTransformer):
    """Annotations and statements without effect (docstrings among them) removed; constant `if`s and passing
    `try`s unwrapped."""

    def __init__(self) -> None:
        self._read: list[set[str]] = []          # names read in each enclosing function

    def _body(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            new = self.visit(stmt)
            out += new if isinstance(new, list) else [new] if new is not None else []
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, field, self._body(stmts))
        for field, value in ast.iter_fields(node):
            if field in ("body", "orelse", "finalbody") and isinstance(value, list):
                continue
            if isinstance(value, list):
                setattr(node, field, [self.visit(v) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.returns = None
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]:
            if arg is not None:
                arg.annotation = None
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        read = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
                read.add(n.id)
            elif isinstance(n, (ast.Global, ast.Nonlocal)):
                read.update(n.names)
        self._read.append(read)
        node.body = self._body(node.body)
        self._read.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        node.bases = [self.visit(b) for b in node.bases]
        node.keywords = [self.visit(k) for k in node.keywords]
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.body = self._body(node.body)
        return node

    def visit_Pass(self, node: ast.Pass) -> None:
        return None

    def visit_Expr(self, node: ast.Expr) -> ast.Expr | None:
        return None if _without_effect(node.value) else self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if len(names) == len(node.targets) and _without_effect(node.value):
            if isinstance(node.value, ast.Name) and all(n == node.value.id for n in names):
                return None                                         # x = x
            if self._read and not set(names) & self._read[-1]:
                return None                                         # a local nobody reads
        return self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return self.visit(ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node))

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        if isinstance(node.target, ast.Name):
            value = ast.BinOp(left=ast.Name(id=node.target.id, ctx=ast.Load()), op=node.op, right=node.value)
            assign = ast.Assign(targets=[node.target], value=ast.copy_location(value, node))
            return self.generic_visit(ast.copy_location(assign, node))
        return self.generic_visit(node)

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt] | None:
        truth = _is_constant(node.test)
        if truth is None:
            return self.generic_visit(node)
        return self._body(node.body if truth else node.orelse) or None

    def visit_While(self, node: ast.While) -> ast.AST | list[ast.stmt] | None:
        if _is_constant(node.test) is False:
            return self._body(node.orelse) or None
        return self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> ast.AST | list[ast.stmt] | None:
        node = self.generic_visit(node)
        if not node.orelse and not node.finalbody and all(not h.body for h in node.handlers):
            return node.body or None
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.ExceptHandler:
        node.type = self.visit(node.type) if node.type is not None else None
        node.body = self._body(node.body)
        return node


def _bound_names(tree: ast.AST) -> set[str]:
    """Names the cell binds: parameters, and what it assigns, loops over, defines or catches."""
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """{name an import binds: the name it imports} (`import numpy as xp` -> xp: numpy)."""
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                if alias.name != "*":
                    out[alias.asname or alias.name.split(".")[0]] = alias.name.rsplit(".", 1)[-1] if alias.asname \
                        else alias.name.split(".")[0]
    return out


class _Serialiser:
    """The AST in source order, one token per node, names canonicalised."""

    def __init__(self, tree: ast.Module) -> None:
        self.imported = _imported_names(tree)
        self.bound = _bound_names(tree)
        self.out: list[Token] = []

    def name(self, name: str) -> str:
        if name in self.imported:
            return self.imported[name]
        return BOUND if name in self.bound else name

    def own_token(self, node: ast.AST) -> str | None:
        """The token a node adds besides its type: a name, a constant, an attribute or a keyword's name."""
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.arg):
            return self.name(node.arg)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return self.name(node.name)
        if isinstance(node, ast.Constant):
            return STRING if isinstance(node.value, (str, bytes)) else repr(node.value)
        if isinstance(node, ast.JoinedStr):
            return STRING
        if isinstance(node, ast.Attribute):
            return "." + node.attr
        if isinstance(node, ast.keyword):
            return f"{node.arg}="
        return None

    def walk(self, node: ast.AST, line: int) -> None:
        line = getattr(node, "lineno", line)
        if not isinstance(node, _SILENT_NODES):
            self.out.append(Token(type(node).__name__, line))
        text = self.own_token(node)
        if text is not None:
            self.out.append(Token(text, line))
        if isinstance(node, (ast.Constant, ast.JoinedStr)):
            return                                               # an f-string's parts are one string
        for _, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self.walk(child, line)


def parse(source: str) -> ast.Module | None:
    """The cell's AST (IPython syntax read as IPython runs it), or None if it does not parse."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    try:
        return ast.parse(python_source(source))          # magics and shell escapes never parse as Python
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def without_no_ops(tree: ast.Module) -> ast.Module:
    """tree (changed in place) without annotations and statements that have no effect."""
    return _DropNoOps().visit(tree)


def serialise(nodes: list[ast.stmt], first_line: int = 1) -> list[Token]:
    """The token stream of these statements, read as a cell holding only them; lines counted from first_line."""
    serialiser = _Serialiser(ast.Module(body=nodes, type_ignores=[]))
    for stmt in nodes:
        serialiser.walk(stmt, first_line)
    return [Token(t.text, t.line - first_line + 1) for t in serialiser.out]


def tokens(source: str) -> list[Token]:
    """The normalised token stream of a cell or a function's source (see the module's docstring)."""
    tree = parse(source)
    if tree is None:
        return [Token(m.group(), source.count("\n", 0, m.start()) + 1)
                for m in re.finditer(r"\w+|[^\w\s]", source)]
    try:
        return serialise(without_no_ops(tree).body)
    except RecursionError:
        return []
