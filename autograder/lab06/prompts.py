"""Lab 06 checks: prompts of repetitive code, where prompt lookup shines, and prompts of the same kind drawn from a seed.

    code_edit_prompts()                  the notebook's two prompts (an argparse block, a Config class)
    drawn_code_prompt(seed, "config")    a Config class whose attributes (names, order, how many) the seed draws
    fresh_prompts(seeds)                 prompt i = drawn_code_prompt(base + i), base the next seed (common.drawn_seeds)

The speed and target-calls checks give every timed or counted call a drawn prompt of its own, so no call can be answered
from an earlier one or from a table computed beforehand (5 or 6 of 24 names in any order: about a hundred million
prompts of each kind).
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

ARGPARSE, CONFIG = "argparse", "config"
NAMES = ("name", "path", "mode", "user", "host", "port", "size", "rate", "color", "level", "count", "limit", "token",
         "label", "owner", "title", "index", "value", "width", "height", "timeout", "retries", "verbose", "seed")


def code_prompt(kind: str, names: tuple[str, ...]) -> list[int]:
    """An argparse block adding one option per name, or a Config class setting one attribute per name, cut where the
    next line starts: its continuation by the target repeats what the prompt already holds."""
    from minigpt.tokenizer import load_tokenizer
    if kind == ARGPARSE:
        args = "".join(f'parser.add_argument("--{n}", type=str, default=None)\n' for n in names)
        text = "import argparse\n\nparser = argparse.ArgumentParser()\n" + args + "parser.add_argument("
    elif kind == CONFIG:
        text = "class Config:\n    def __init__(self):\n" + "".join(f"        self.{n} = None\n" for n in names) + "        self."
    else:
        raise ValueError(f"kind must be {ARGPARSE!r} or {CONFIG!r}, got {kind!r}")
    return load_tokenizer().encode(text)


def code_edit_prompts() -> list[list[int]]:
    """Prompts of repetitive code (argument lists, attribute assignments) whose continuation by the target repeats
    what the prompt already holds: where prompt lookup shines. (The course's small target copies little from
    a longer context, so prompts with a single earlier copy of a function do not show it.)"""
    return [code_prompt(ARGPARSE, ("name", "path", "mode", "user")),
            code_prompt(CONFIG, ("name", "path", "mode", "user", "host"))]


def drawn_code_prompt(seed: int, kind: str = CONFIG) -> list[int]:
    """A `code_prompt` of `kind` with 5 or 6 of NAMES, which ones and their order drawn by `seed` (its own generator)."""
    g = torch.Generator().manual_seed(seed)
    count = 5 + int(torch.randint(2, (1,), generator=g))
    order = torch.randperm(len(NAMES), generator=g)[:count].tolist()
    return code_prompt(kind, tuple(NAMES[i] for i in order))


def fresh_prompts(seeds: Iterator[int], kind: str = CONFIG) -> Callable[[int], list[int]]:
    """inputs(i) for harness.EachCallItsOwnInput: prompt i is drawn_code_prompt(base + i), base the next of `seeds`
    (common.drawn_seeds: a secret when judged), so each timed call has a prompt of its own (two alike by a chance of
    about 1 in 10^8) and none can be foreseen."""
    base = next(seeds)
    return lambda i: drawn_code_prompt(base + i, kind)
