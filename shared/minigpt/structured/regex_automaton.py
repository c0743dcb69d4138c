"""A regular expression as a deterministic finite automaton over characters (lab 10).

The automaton is built by `interegular` (a maintained regex-to-FSM library: Python `re` syntax without look-around
or back-references); this module only reads it. States are ints; a character moves a state to at most one state:

    dfa = RegexAutomaton.compile(r"(true|false)")
    s = dfa.walk(dfa.start, "tr")        # the state after reading "tr", or None if no string of the language starts so
    dfa.accepting(s), dfa.live(s)        # is "tr" in the language? can it still become a string of the language?

`live` states are those from which an accepting state is reachable: a constrained decoder must never leave them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import interegular
from interegular.fsm import anything_else

__all__ = ["RegexAutomaton", "CountingAutomaton"]


@dataclass(frozen=True)
class RegexAutomaton:
    pattern: str
    start: int
    symbols: dict[str, int]                      # character -> symbol (characters of one class share a symbol)
    other: int | None                            # the symbol of every character not in `symbols`, if the regex has one
    transitions: dict[int, dict[int, int]]       # state -> {symbol: next state}; a missing entry is a dead end
    finals: frozenset[int]
    live_states: frozenset[int]

    @classmethod
    def compile(cls, pattern: str) -> "RegexAutomaton":
        """The DFA of `pattern` (the whole string must match, as `re.fullmatch`)."""
        try:
            fsm = interegular.parse_pattern(pattern).to_fsm()
        except Exception as err:                             # interegular's own errors name the unsupported construct
            raise ValueError(f"cannot compile {pattern!r} to an automaton: {type(err).__name__}: {err}") from None
        symbols = {ch: sym for ch, sym in fsm.alphabet.items() if ch is not anything_else}
        other = fsm.alphabet[anything_else] if anything_else in fsm.alphabet else None
        transitions = {s: dict(fsm.map.get(s, {})) for s in fsm.states}
        return cls(pattern, fsm.initial, symbols, other, transitions, frozenset(fsm.finals),
                   _reaching(transitions, frozenset(fsm.finals)))

    def start_state(self) -> int:
        """The state before any character (as `Grammar.start_state`: one call starts either automaton)."""
        return self.start

    @property
    def states(self) -> list[int]:
        return sorted(self.transitions)

    def step(self, state: int, ch: str) -> int | None:
        """The state after one character, or None where the automaton has no transition (or only into dead states)."""
        sym = self.symbols.get(ch, self.other)
        nxt = None if sym is None else self.transitions[state].get(sym)
        return nxt if nxt in self.live_states else None

    def walk(self, state: int | None, text: str) -> int | None:
        """The state after `text`, or None as soon as a character leads nowhere live."""
        for ch in text:
            if state is None:
                return None
            state = self.step(state, ch)
        return state

    def accepting(self, state: int | None) -> bool:
        return state in self.finals

    def live(self, state: int | None) -> bool:
        return state in self.live_states

    def fullmatch(self, text: str) -> bool:
        return self.accepting(self.walk(self.start, text))


class CountingAutomaton:
    """An automaton (a RegexAutomaton or a Grammar) that counts the characters it is asked to read: `steps` is what
    a mask computation costs in transitions, the same on every machine (a scan reads every token's text, a trie
    walk each shared prefix once)."""

    def __init__(self, automaton: Any) -> None:
        self.automaton = automaton
        self.steps = 0

    @property
    def start(self) -> Any:
        return self.automaton.start_state()

    def start_state(self) -> Any:
        return self.automaton.start_state()

    def step(self, state: Any, ch: str) -> Any:
        self.steps += 1
        return self.automaton.step(state, ch)

    def walk(self, state: Any, text: str) -> Any:
        for ch in text:
            if state is None:
                return None
            state = self.step(state, ch)
        return state

    def accepting(self, state: Any) -> bool:
        return self.automaton.accepting(state)

    def live(self, state: Any) -> bool:
        return state is not None and (self.automaton.live(state) if hasattr(self.automaton, "live") else True)


def _reaching(transitions: dict[int, dict[int, int]], finals: frozenset[int]) -> frozenset[int]:
    """States from which some accepting state can be reached (finals included): a fixed point, backwards."""
    live = set(finals)
    changed = True
    while changed:
        changed = False
        for state, moves in transitions.items():
            if state not in live and any(nxt in live for nxt in moves.values()):
                live.add(state)
                changed = True
    return frozenset(live)
