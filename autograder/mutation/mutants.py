"""Mutants of one solution cell: mutmut's operators (numbers, strings, names, operators, comparisons, removed call
arguments, ...) and the course's own kinds (operators.py: the bugs students write), applied one at a time to the
lines between `### BEGIN SOLUTION` and `### END SOLUTION`.

    mutants_of(source, cell="ex1_code") -> [Mutant(id, cell, line, kind, source), ...]

A mutant's id is stable across runs and machines (the cell, the line and a hash of the mutated source), so a list of
known equivalent mutants can name it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider
from mutmut.mutation.file_mutation import MutationVisitor, deep_replace
from mutmut.mutation.mutators import mutation_operators
from mutmut.mutation.pragma_handling import IgnoredCode

from autograder.mutation.operators import COURSE_OPERATORS, TILE_NAME, tile_swap

__all__ = ["Mutant", "mutants_of", "solution_lines", "COURSE_OPERATORS"]

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


@dataclass(frozen=True)
class Mutant:
    id: str
    cell: str
    line: int          # 1-based line in the cell of the mutated node
    kind: str          # "mutmut" or the course operator's name
    source: str        # the whole mutated cell

    def diff_line(self, original: str) -> str:
        """The mutated line, and the line it replaced: "12: x = a + b  ->  x = a - b"."""
        old, new = original.splitlines(), self.source.splitlines()
        for i, (a, b) in enumerate(zip(old, new), start=1):
            if a != b:
                return f"{i}: {a.strip()}  ->  {b.strip()}"
        return f"{self.line}: (lines removed)"


def solution_lines(source: str) -> set[int]:
    """1-based line numbers strictly between BEGIN and END SOLUTION markers (all lines if there are none)."""
    lines, inside, chosen = source.splitlines(), False, set()
    for i, text in enumerate(lines, start=1):
        if text.strip() == BEGIN:
            inside = True
        elif text.strip() == END:
            inside = False
        elif inside:
            chosen.add(i)
    return chosen if any(t.strip() == BEGIN for t in lines) else set(range(1, len(lines) + 1))


class _Visitor(MutationVisitor):
    """mutmut's visitor, decorated functions included: mutmut skips them because it swaps functions through
    trampolines; here each mutant is a whole cell, so @torch.inference_mode() and @triton.jit bodies are mutated too
    (the decorator expressions themselves still are not)."""

    def _skip_node_and_children(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.FunctionDef) and node.decorators:
            return False
        return super()._skip_node_and_children(node)


class _CourseVisitor(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, lines: set[int], operators: list):
        self.lines, self.operators, self.found = lines, operators, []

    def on_visit(self, node: cst.CSTNode) -> bool:
        position = self.get_metadata(PositionProvider, node, None)
        if position is not None and position.start.line in self.lines:
            for kind, node_type, operator in self.operators:
                if isinstance(node, node_type):
                    self.found += [(kind, node, new, position.start.line) for new in operator(node)]
        return True


def mutants_of(source: str, cell: str, only_lines: set[int] | None = None) -> list[Mutant]:
    """Every single-point mutant of the cell's solution lines (or of those of them in `only_lines`), mutmut's first,
    then the course's; duplicates (two operators giving the same source) and mutants that do not compile are left
    out."""
    lines = solution_lines(source) if only_lines is None else solution_lines(source) & only_lines
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    mutmut_visitor = _Visitor(mutation_operators, IgnoredCode(set(), set(), set()), lines)
    tree = wrapper.visit(mutmut_visitor)
    positions = wrapper.resolve(PositionProvider)
    found = [("mutmut", mut.original_node, mut.mutated_node, positions[mut.original_node].start.line)
             for mut in mutmut_visitor.mutations]
    tiles = set(TILE_NAME.findall(source))
    course = _CourseVisitor(lines, COURSE_OPERATORS + ([("tile size swap", cst.Name, tile_swap(tiles))]
                                                       if len(tiles) > 1 else []))
    wrapper.visit(course)
    found += course.found
    out, seen = [], {source}
    for kind, old, new, line in found:
        mutated = deep_replace(tree, old, new)
        text = mutated.code if isinstance(mutated, cst.Module) else None
        if text is None or text in seen:
            continue
        try:
            compile(text, cell, "exec")
        except SyntaxError:
            continue
        seen.add(text)
        digest = hashlib.sha1(text.encode()).hexdigest()[:10]
        out.append(Mutant(f"{cell}:{line}:{digest}", cell, line, kind, text))
    return out
