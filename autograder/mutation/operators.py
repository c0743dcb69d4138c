"""The course's mutation operators: the bugs students write that mutmut's operators do not (issues 34 and 57).

Each operator takes a libcst node and yields the nodes that may replace it, one bug each:

    statement deleted        x = f(y); cache.append(k); return out; raise ValueError(...)  ->  pass
    arguments swapped        torch.cat(a, b) -> (b, a): two neighbouring positional arguments
    off by one               range(n) -> range(n + 1) / range(n - 1); x[a:b] -> x[a:b + 1], x[a - 1:b] ...;
                             x[i] -> x[i + 1]: any bound that is not a literal (mutmut moves literals)
    shape op dropped         x.t(), x.T, x.transpose(1, 2), x.permute(...), x.swapaxes(...) -> x
    reduction dim moved      sum(dim=d) -> dim=0 / dim=-1 where d is not a literal
    in place <-> copy        x.add_(y) <-> x.add(y); x += y -> x = x + y
    device and dtype         device=<expr> -> device="cpu"; torch.float32 <-> torch.float16, torch.bfloat16
    plus issue 34's          .contiguous() / .float() / .clone() dropped, -inf -> -1e4, except Exception <->
                             BaseException, one tile size for another (BLOCK_M for BLOCK_N)

Comparison boundaries (< for <=, on any operands) come from mutmut's own operator set.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import libcst as cst
import libcst.matchers as m

__all__ = ["COURSE_OPERATORS", "TILE_NAME", "tile_swap"]

Operator = Callable[[cst.CSTNode], Iterable[cst.CSTNode]]


def _is_literal(expr: cst.BaseExpression) -> bool:
    return m.matches(expr, m.Integer() | m.Float() | m.UnaryOperation(expression=m.Integer() | m.Float())
                     | m.SimpleString() | m.Name("None"))


def _parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    """expr, in parentheses unless it binds tighter than + and - (a name, an attribute, a call, a subscript)."""
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer)) or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _shifted(expr: cst.BaseExpression, delta: int) -> cst.BinaryOperation:
    return cst.BinaryOperation(left=_parenthesized(expr), operator=cst.Add() if delta > 0 else cst.Subtract(),
                               right=cst.Integer("1"))


# ------------------------------------------------------------------------------------------- issue 57's kinds

def _delete_statement(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """A line left out: one simple statement (not a docstring, not `pass`) made `pass`."""
    if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
        return
    stmt = node.body[0]
    if isinstance(stmt, cst.Pass) or m.matches(stmt, m.Expr(value=m.SimpleString() | m.ConcatenatedString())):
        return
    yield node.with_changes(body=[cst.Pass()])


def _swap_arguments(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """f(a, b) -> f(b, a), for each pair of neighbouring positional arguments that differ."""
    if not isinstance(node, cst.Call):
        return
    args = list(node.args)
    for i in range(len(args) - 1):
        a, b = args[i], args[i + 1]
        if a.keyword or b.keyword or a.star or b.star or a.value.deep_equals(b.value):
            continue
        swapped = args.copy()
        swapped[i], swapped[i + 1] = a.with_changes(value=b.value), b.with_changes(value=a.value)
        yield node.with_changes(args=swapped)


def _off_by_one(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """A bound that is not a literal moved by one: range's start and stop, a slice's ends, an index (+1)."""
    if m.matches(node, m.Call(func=m.Name("range"))) and 1 <= len(node.args) <= 3:
        args = list(node.args)
        for at in ([0] if len(args) == 1 else [0, 1]):
            if not args[at].keyword and not args[at].star and not _is_literal(args[at].value):
                for delta in (1, -1):
                    moved = args.copy()
                    moved[at] = args[at].with_changes(value=_shifted(args[at].value, delta))
                    yield node.with_changes(args=moved)
    elif isinstance(node, cst.Slice):
        for end in ("lower", "upper"):
            bound = getattr(node, end)
            if bound is not None and not _is_literal(bound):
                for delta in (1, -1):
                    yield node.with_changes(**{end: _shifted(bound, delta)})
    elif isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        index = node.slice[0].slice
        if not index.star and isinstance(index.value, (cst.Name, cst.Attribute, cst.BinaryOperation)):
            element = node.slice[0].with_changes(slice=index.with_changes(value=_shifted(index.value, 1)))
            yield node.with_changes(slice=[element])


SHAPE_METHODS = {"t", "transpose", "permute", "swapaxes", "swapdims"}


def _drop_shape_op(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """x.t(), x.transpose(1, 2), x.permute(0, 2, 1, 3), x.T, x.mT -> x (a dropped .contiguous() is issue 34's)."""
    if m.matches(node, m.Call(func=m.Attribute(attr=m.Name(m.MatchIfTrue(lambda n: n in SHAPE_METHODS))))):
        yield node.func.value
    elif m.matches(node, m.Attribute(attr=m.Name("T") | m.Name("mT"))):
        yield node.value


def _move_reduction_dim(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """dim=d (or axis=d) where d is not a literal -> dim=0 and dim=-1 (whichever differ from d's text)."""
    if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value in ("dim", "axis") \
            and not _is_literal(node.value):
        for value in (cst.Integer("0"), cst.UnaryOperation(operator=cst.Minus(), expression=cst.Integer("1"))):
            yield node.with_changes(value=value)


# Tensor methods that have both forms (x.add(y) and x.add_(y)).
IN_PLACE = {"add", "sub", "mul", "div", "clamp", "clamp_min", "clamp_max", "masked_fill", "exp", "neg", "sqrt",
            "abs", "pow", "relu", "sigmoid", "tanh", "scatter", "scatter_add", "index_add", "index_copy",
            "index_fill", "masked_scatter", "copysign", "fmod", "remainder", "round", "floor", "ceil", "log",
            "softmax", "unsqueeze", "squeeze", "transpose", "t"}
MODULES = {"math", "torch", "np", "numpy", "F", "nn", "functional", "tl", "triton", "random", "statistics", "os"}
_AUG_TO_BIN = {cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
               cst.DivideAssign: cst.Divide, cst.FloorDivideAssign: cst.FloorDivide, cst.MatrixMultiplyAssign:
               cst.MatrixMultiply}


def _in_place_or_copy(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """x.add_(y) -> x.add(y) (the result thrown away, or a copy where the caller sees the original),
    x.add(y) -> x.add_(y) (an input written in place), x += y -> x = x + y (a new tensor where a view was updated)."""
    if m.matches(node, m.Call(func=m.Attribute(attr=m.Name()))) and not m.matches(
            node.func.value, m.Name(m.MatchIfTrue(lambda n: n in MODULES))):
        name = node.func.attr.value
        if name.endswith("_") and not name.startswith("_") and name[:-1] in IN_PLACE and name[:-1] not in ("softmax",):
            yield node.with_changes(func=node.func.with_changes(attr=cst.Name(name[:-1])))
        elif name in IN_PLACE and name != "softmax":
            yield node.with_changes(func=node.func.with_changes(attr=cst.Name(name + "_")))
    elif isinstance(node, cst.AugAssign) and type(node.operator) in _AUG_TO_BIN and isinstance(
            node.target, (cst.Name, cst.Attribute, cst.Subscript)):
        binary = cst.BinaryOperation(left=node.target, operator=_AUG_TO_BIN[type(node.operator)](),
                                     right=_parenthesized(node.value))
        yield cst.Assign(targets=[cst.AssignTarget(target=node.target)], value=binary)


def _device_to_cpu(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """device=<expr> -> device="cpu": a tensor made on the CPU whatever the model's device."""
    if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == "device" and not \
            m.matches(node.value, m.SimpleString(value=m.MatchIfTrue(lambda v: v.strip("'\"") == "cpu"))):
        yield node.with_changes(value=cst.SimpleString('"cpu"'))


# ------------------------------------------------------------------------------------------- issue 34's kinds

def _drop_method(name: str) -> Operator:
    """x.name() -> x (a dropped .contiguous(), .float(), .clone(), ...)."""
    def operator(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        if m.matches(node, m.Call(func=m.Attribute(attr=m.Name(name)), args=[])):
            yield node.func.value
    return operator


def _minus_inf_to_large_negative(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """float("-inf"), -math.inf, -torch.inf, -float("inf") -> -1e4 (a mask that is only very negative)."""
    minus_inf = m.Call(func=m.Name("float"), args=[m.Arg(m.SimpleString(value=m.MatchIfTrue(
        lambda v: v.strip("'\"").lower() == "-inf")))])
    negated = m.UnaryOperation(operator=m.Minus(), expression=m.Attribute(attr=m.Name("inf"))
                               | m.Call(func=m.Name("float"), args=[m.Arg(m.SimpleString(value=m.MatchIfTrue(
                                   lambda v: v.strip("'\"").lower() == "inf")))]))
    if m.matches(node, minus_inf | negated):
        yield cst.parse_expression("-1e4")


def _dtype_swap(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """torch.float32 <-> torch.float16, torch.float16 -> torch.bfloat16: a result in the wrong precision."""
    swaps = {"float32": "float16", "float": "half", "float16": "bfloat16", "bfloat16": "float16", "half": "float"}
    if m.matches(node, m.Attribute(value=m.Name("torch"), attr=m.Name(m.MatchIfTrue(lambda n: n in swaps)))):
        yield node.with_changes(attr=cst.Name(swaps[node.attr.value]))


def _broad_except(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """except Exception -> except BaseException (swallows KeyboardInterrupt and SystemExit too)."""
    if m.matches(node, m.ExceptHandler(type=m.Name("Exception"))):
        yield node.with_changes(type=cst.Name("BaseException"))


def _narrow_except(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """except BaseException -> except Exception (a cancelled request, a CancelledError or KeyboardInterrupt, skips
    the cleanup: the slot is never freed)."""
    if m.matches(node, m.ExceptHandler(type=m.Name("BaseException"))):
        yield node.with_changes(type=cst.Name("Exception"))


TILE_NAME = re.compile(r"\b(?:BLOCK_(?:[A-Z]|SIZE)|PAGE_SIZE|block_(?:[a-z]|size)|page_size)\b")


def tile_swap(names: set[str]) -> Operator:
    """BLOCK_M -> BLOCK_N (each tile-size name for each other one of the same cell, same case): a loop bound or an
    offset written with the wrong block size, invisible while the tiles are equal."""
    def operator(node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        if isinstance(node, cst.Name) and node.value in names:
            for other in sorted(names - {node.value}):
                if other.isupper() == node.value.isupper():
                    yield node.with_changes(value=other)
    return operator


COURSE_OPERATORS: list[tuple[str, type, Operator]] = [
    ("drop .contiguous()", cst.Call, _drop_method("contiguous")),
    ("drop .float()", cst.Call, _drop_method("float")),
    ("drop .clone()", cst.Call, _drop_method("clone")),
    ("-inf -> -1e4", cst.BaseExpression, _minus_inf_to_large_negative),
    ("dtype swap", cst.Attribute, _dtype_swap),
    ("Exception -> BaseException", cst.ExceptHandler, _broad_except),
    ("BaseException -> Exception", cst.ExceptHandler, _narrow_except),
    ("statement deleted", cst.SimpleStatementLine, _delete_statement),
    ("arguments swapped", cst.Call, _swap_arguments),
    ("off by one", cst.CSTNode, _off_by_one),
    ("shape op dropped", cst.BaseExpression, _drop_shape_op),
    ("reduction dim moved", cst.Arg, _move_reduction_dim),
    ("in place <-> copy", cst.CSTNode, _in_place_or_copy),
    ("device -> cpu", cst.Arg, _device_to_cpu),
]
