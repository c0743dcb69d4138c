"""A context-free grammar over characters and the pushdown recognizer that runs it, one character at a time (lab 10).

    g = Grammar("value")                                   # start symbol
    g.rule("value", ["true"], ["false"], ["[", "items", "]"])  # alternatives, each a sequence of symbols
    state = g.start_state()                                # a set of stacks
    state = g.advance(state, "t")                          # None once no stack can read the character

Symbols: a rule's name (a nonterminal, two characters or more), or a terminal: a one-character string, or a `CharSet`
(a set of characters, or every character but a set); `literal("true")` puts a string's characters in an alternative. The recognizer keeps every stack the input so far allows, each stack the symbols
still to match (top first), as a tuple: persistent, so stacks share nothing mutable and a state is a frozenset of
them. Reading a character expands each stack's top nonterminal into its alternatives until a terminal is on top, and
keeps the stacks whose terminal takes the character. Rules must not be left-recursive (a nonterminal that can
expand to itself on top without reading a character): `check` finds such a rule and names it. A rule is productive
when some alternative derives a finite string (every symbol a terminal that reads some character, or a productive
rule; a least fixed point): `check` refuses a start rule that is not, and `prune` drops every alternative that uses
an unproductive symbol, so that no prefix the recognizer takes is a dead end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Union

__all__ = ["CharSet", "Grammar", "Symbol", "State", "literal", "END"]


@dataclass(frozen=True)
class CharSet:
    """A terminal that reads one character: one of `chars`, or (negated) any character but those."""
    chars: frozenset[str]
    negated: bool = False

    def __contains__(self, ch: str) -> bool:
        return (ch in self.chars) != self.negated

    @classmethod
    def of(cls, chars: Iterable[str]) -> "CharSet":
        return cls(frozenset(chars))

    @classmethod
    def but(cls, chars: Iterable[str]) -> "CharSet":
        return cls(frozenset(chars), negated=True)

    def __and__(self, other: "CharSet") -> "CharSet":
        if not self.negated and not other.negated:
            return CharSet(self.chars & other.chars)
        if self.negated and other.negated:
            return CharSet(self.chars | other.chars, negated=True)
        plain, excluded = (self, other) if not self.negated else (other, self)
        return CharSet(plain.chars - excluded.chars)


def literal(text: str) -> tuple[str, ...]:
    """A literal inside an alternative: one terminal per character (a bare string alternative is one already)."""
    return tuple(text)


class _End:
    """The end of a rule's alternative on a stack (see `Grammar._close`)."""

    def __repr__(self) -> str:
        return "END"


END = _End()
Symbol = Union[str, CharSet, _End]          # a str of length 1 is a terminal character; a longer one or a name, a rule
Stack = tuple[Symbol, ...]
State = frozenset[Stack]


@dataclass
class Grammar:
    start: str
    rules: dict[str, list[tuple[Symbol, ...]]] = field(default_factory=dict)

    def rule(self, name: str, *alternatives: Iterable[Symbol]) -> str:
        """Add alternatives to rule `name` (names must be longer than one character); returns the name."""
        if len(name) < 2:
            raise ValueError(f"rule names have two characters or more (one character is a terminal): {name!r}")
        self.rules.setdefault(name, []).extend(tuple(_split(a)) for a in alternatives)
        return name

    @staticmethod
    def _is_rule(symbol: Symbol) -> bool:
        return isinstance(symbol, str) and len(symbol) > 1

    def check(self) -> None:
        """Every rule used is defined, none is left-recursive (the recognizer would expand it forever), and the start
        rule derives some finite string."""
        for name, alternatives in self.rules.items():
            for alt in alternatives:
                for s in alt:
                    if self._is_rule(s) and s not in self.rules:
                        raise ValueError(f"rule {name!r} uses {s!r}, which has no rule")
        nullable = self._nullable()
        for name in self.rules:
            seen, todo = set(), [name]
            while todo:
                for alt in self.rules[todo.pop()]:
                    for s in alt:
                        if not self._is_rule(s):
                            break
                        if s == name:
                            raise ValueError(f"rule {name!r} is left-recursive: write it right-recursively")
                        if s not in seen:
                            seen.add(s)
                            todo.append(s)
                        if s not in nullable:
                            break
        if self.start not in self.productive():
            raise ValueError(f"rule {self.start!r} derives no finite string: no output can finish it")

    def productive(self) -> set[str]:
        """The rules that derive some finite string: the least fixed point of "some alternative's every symbol is a
        terminal that reads a character or a productive rule", by counting down each alternative's rules not yet
        known productive (linear in the grammar's size: a bounded repeat is a long chain of rules)."""
        waiting: dict[tuple[str, int], int] = {}             # (rule, alternative) -> its rules not yet productive
        users: dict[str, list[tuple[str, int]]] = {}
        todo: list[str] = []
        for name, alternatives in self.rules.items():
            for i, alt in enumerate(alternatives):
                if not all(self._yields(s, set()) for s in alt if not self._is_rule(s)):
                    continue                                 # an empty character set: this alternative never ends
                needed = {s for s in alt if self._is_rule(s)}
                waiting[name, i] = len(needed)
                for rule in needed:
                    users.setdefault(rule, []).append((name, i))
                if not needed:
                    todo.append(name)
        found: set[str] = set()
        while todo:
            name = todo.pop()
            if name in found:
                continue
            found.add(name)
            for user in users.get(name, []):
                waiting[user] -= 1
                if waiting[user] == 0:
                    todo.append(user[0])
        return found

    def _yields(self, symbol: Symbol, productive: set[str]) -> bool:
        if self._is_rule(symbol):
            return symbol in productive
        return not (isinstance(symbol, CharSet) and not symbol.negated and not symbol.chars)

    def prune(self) -> None:
        """Drop every alternative with a symbol that derives nothing (and the rules left without one): what is left
        derives the same strings, and every stack the recognizer keeps can still be finished."""
        productive = self.productive()
        for name in list(self.rules):
            if name not in productive:
                del self.rules[name]
            elif not all(self._yields(s, productive) for alt in self.rules[name] for s in alt):
                self.rules[name] = [alt for alt in self.rules[name] if all(self._yields(s, productive) for s in alt)]

    def _nullable(self) -> set[str]:
        nullable: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, alternatives in self.rules.items():
                if name not in nullable and any(all(self._is_rule(s) and s in nullable for s in alt)
                                                for alt in alternatives):
                    nullable.add(name)
                    changed = True
        return nullable

    def start_state(self) -> State:
        return self._close([(self.start,)])

    def _close(self, stacks: Iterable[Stack], *, keep_ends: bool = False) -> State:
        """Expand every stack until a terminal is on top (or it is empty: the input so far is a whole sentence).

        Expanding a rule pushes an END marker under its alternative (unless one is already there: a rule that ends
        its parent's alternative shares the parent's marker, so right recursion does not grow the stack), so a
        stack's symbols up to its first END are what is left of the innermost rule. An END on top is popped, or,
        with `keep_ends`, kept: the stack then stands for "this rule is done, what follows is the context's"."""
        done: set[Stack] = set()
        todo = list(stacks)
        seen: set[Stack] = set()
        while todo:
            stack = todo.pop()
            if stack in seen:
                continue
            seen.add(stack)
            if stack and stack[0] is END and not keep_ends:
                todo.append(stack[1:])
            elif stack and self._is_rule(stack[0]):
                rest = stack[1:]
                marker = () if not rest or rest[0] is END else (END,)
                todo.extend(alt + marker + rest for alt in self.rules[stack[0]])
            else:
                done.add(stack)
        return frozenset(done)

    def advance(self, state: State | None, ch: str, *, keep_ends: bool = False) -> State | None:
        """The stacks after reading `ch`, or None when none can read it."""
        if not state:
            return None
        moved = [stack[1:] for stack in state if stack and stack[0] is not END and (
            stack[0] == ch if isinstance(stack[0], str) else ch in stack[0])]
        return self._close(moved, keep_ends=keep_ends) if moved else None

    step = advance                                  # the names token_masks walks an automaton with

    def advance_text(self, state: State | None, text: str) -> State | None:
        for ch in text:
            state = self.advance(state, ch)
            if state is None:
                return None
        return state

    walk = advance_text

    def forced_text(self, state: State | None, limit: int = 256) -> str:
        """The characters every continuation of `state` starts with: read while every stack has the same single
        character on top and the input cannot end (an empty stack) here; '' where there is a choice."""
        out: list[str] = []
        while state and len(out) < limit and () not in state:
            tops = {s[0] for s in state}
            top = next(iter(tops))
            if len(tops) > 1 or not (isinstance(top, str) or (not top.negated and len(top.chars) == 1)):
                break
            ch = top if isinstance(top, str) else next(iter(top.chars))
            out.append(ch)
            state = self.advance(state, ch)
        return "".join(out)

    @staticmethod
    def accepting(state: State | None) -> bool:
        return bool(state) and () in state

    def matches(self, text: str) -> bool:
        return self.accepting(self.advance_text(self.start_state(), text))


def _split(alternative: Iterable[Symbol]) -> list[Symbol]:
    """An alternative as symbols; a bare string is a literal, one terminal per character."""
    if isinstance(alternative, str):
        return list(alternative)
    return [piece for s in alternative for piece in (s if isinstance(s, tuple) else (s,))]   # literal(...) flattened
