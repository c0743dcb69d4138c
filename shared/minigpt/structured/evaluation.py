"""How lab 10's structured generation is checked: by the valid rate of what it writes, and against the maintained
engines (XGrammar, llguidance) on the course's own tokenizer.

    suite = load_suite()                              # data/structured/schemas.json: schemas agents send, with prompts
    rates = valid_rates(model, enc, suite, constrained=True, max_new_tokens=256, seeds=[None, 0, 1])
    rates.total().valid                               # share of documents jsonschema accepts
    print(rates.table())                              # per schema: parses, valid, mean tokens, stop reasons

A run is one document: the schema's prompt, then `generate_constrained` with the schema's grammar (masks from one
`ContextCache` per schema, shared by its runs), greedy for seed None, else sampled at `temperature` with that seed.
`constrained=False` runs the same loop without the mask, so the unconstrained rate is measured, not assumed. A
document "parses" when `json.loads` takes its whole text, and is "valid" when it parses and `jsonschema` (Draft
2020-12) accepts it against the schema as written (anchored patterns included).

Anchored patterns (`^...$`, as most real schemas write them) compile as they are: the compiler matches a pattern
against the whole string and drops the anchors that only say so (`json_schema.whole_string_pattern`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jsonschema

from minigpt.paths import data_dir
from minigpt.sampling import SamplingParams
from minigpt.structured.constrained import generate_constrained
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import TokenTrie, Vocabulary

__all__ = ["SuiteSchema", "Run", "Rates", "ValidRates", "load_suite", "valid_rates",
           "xgrammar_tokenizer_info", "llguidance_tokenizer", "xgrammar_json_options", "llguidance_json_options"]


@dataclass(frozen=True)
class SuiteSchema:
    name: str
    prompt: str
    schema: dict[str, Any]
    example: Any                       # one document the schema accepts


def load_suite(path: Path | None = None) -> list[SuiteSchema]:
    """The held-out schemas (default data/structured/schemas.json)."""
    found = json.loads((path or data_dir() / "structured" / "schemas.json").read_text())
    return [SuiteSchema(s["name"], s["prompt"], s["schema"], s["example"]) for s in found["schemas"]]


@dataclass(frozen=True)
class Run:
    schema: str
    seed: int | None                   # None: greedy
    text: str
    tokens: int
    stopped: str                       # "end", "length" or "no token" (generate_constrained's)
    parses: bool
    valid: bool


@dataclass(frozen=True)
class Rates:
    runs: int
    parses: float                      # share of documents json.loads takes whole
    valid: float                       # share jsonschema accepts
    mean_tokens: float
    stopped: dict[str, int]


@dataclass
class ValidRates:
    constrained: bool
    runs: list[Run] = field(default_factory=list)

    @staticmethod
    def _rates(runs: Sequence[Run]) -> Rates:
        n = max(1, len(runs))
        return Rates(len(runs), sum(r.parses for r in runs) / n, sum(r.valid for r in runs) / n,
                     sum(r.tokens for r in runs) / n, dict(Counter(r.stopped for r in runs)))

    def per_schema(self) -> dict[str, Rates]:
        names = dict.fromkeys(r.schema for r in self.runs)
        return {name: self._rates([r for r in self.runs if r.schema == name]) for name in names}

    def total(self) -> Rates:
        return self._rates(self.runs)

    def table(self) -> str:
        """Markdown: one row per schema and a total."""
        lines = ["| schema | runs | parses | valid | mean tokens | stopped |", "|---|---|---|---|---|---|"]
        for name, r in [*self.per_schema().items(), ("**total**", self.total())]:
            stops = ", ".join(f"{k} {v}" for k, v in sorted(r.stopped.items()))
            lines.append(f"| {name} | {r.runs} | {r.parses:.0%} | {r.valid:.0%} | {r.mean_tokens:.1f} | {stops} |")
        return "\n".join(lines)


def valid_rates(model: Any, tokenizer: Any, schemas: Sequence[SuiteSchema], *, constrained: bool,
                max_new_tokens: int, seeds: Sequence[int | None], temperature: float = 1.0,
                trie: TokenTrie | None = None) -> ValidRates:
    """One document per (schema, seed) after the schema's prompt; whether each parses and is valid."""
    trie = trie or TokenTrie(Vocabulary.from_tokenizer(tokenizer))
    found = ValidRates(constrained)
    for entry in schemas:
        grammar = compile_json_schema(entry.schema)
        cache = ContextCache(grammar, trie)
        validator = jsonschema.Draft202012Validator(entry.schema)
        prompt = tokenizer.encode(entry.prompt)
        for seed in seeds:
            sampling = SamplingParams() if seed is None else SamplingParams(temperature=temperature, seed=seed)
            out = generate_constrained(model, prompt, grammar, trie, max_new_tokens=max_new_tokens,
                                       sampling=sampling, constrain=constrained, masks=cache.mask)
            try:
                document, parses = json.loads(out.text), True
            except ValueError:
                document, parses = None, False
            found.runs.append(Run(entry.name, seed, out.text, len(out.tokens), out.stopped, parses,
                                  parses and validator.is_valid(document)))
    return found


# The maintained engines on the course tokenizer (the tests compare masks with them; the bench times them).

def xgrammar_tokenizer_info(tokenizer: Any) -> Any:
    """XGrammar's view of a tiktoken Encoding: every token's raw bytes, `<|endoftext|>` the stop token."""
    import xgrammar

    vocab = Vocabulary.from_tokenizer(tokenizer)
    tokens = [tokenizer.decode_single_token_bytes(i) if i != vocab.eos_id else b"<|endoftext|>"
              for i in range(len(vocab))]
    return xgrammar.TokenizerInfo(tokens, vocab_type=xgrammar.VocabType.RAW, vocab_size=len(vocab),
                                  stop_token_ids=[vocab.eos_id])


def llguidance_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a tiktoken Encoding (its ranks, special tokens and split pattern)."""
    import llguidance.tiktoken

    return llguidance.tiktoken.lltokenizer_from_encoding(tokenizer)


def xgrammar_json_options() -> dict[str, Any]:
    """`GrammarCompiler.compile_json_schema` keywords for the course's language: compact JSON, no extra properties."""
    return {"any_whitespace": False, "separators": (",", ":"), "strict_mode": True}


def llguidance_json_options() -> dict[str, Any]:
    """`LLMatcher.grammar_from_json_schema` defaults for compact JSON (",", ":", no whitespace)."""
    return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def main(argv: Sequence[str] | None = None) -> int:
    """python -m minigpt.structured.evaluation [--model target] [--max-new-tokens 256] [--seeds greedy,0,1,2]:
    the suite's valid rates, constrained and not, as Markdown tables (and every document as JSON with --out)."""
    import argparse
    import time

    import torch

    from minigpt.checkpoint import load_model
    from minigpt.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(prog="python -m minigpt.structured.evaluation", description=main.__doc__)
    ap.add_argument("--model", default="target")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seeds", default="greedy,0,1,2", help="comma-separated: 'greedy' or an int (temperature 1)")
    ap.add_argument("--only", default="", help="comma-separated schema names (default: the whole suite)")
    ap.add_argument("--out", type=Path, default=None, help="write every document and the totals here (JSON)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [None if s.strip() == "greedy" else int(s) for s in a.seeds.split(",")]
    suite = [e for e in load_suite() if not a.only or e.name in a.only.split(",")]
    model, enc = load_model(a.model), load_tokenizer()
    trie = TokenTrie(Vocabulary.from_tokenizer(enc))
    record: dict[str, Any] = {"model": a.model, "max_new_tokens": a.max_new_tokens, "seeds": seeds}
    for constrained in (True, False):
        start = time.perf_counter()
        rates = valid_rates(model, enc, suite, constrained=constrained, max_new_tokens=a.max_new_tokens, seeds=seeds,
                            trie=trie)
        seconds = time.perf_counter() - start
        kind = "constrained" if constrained else "unconstrained"
        print(f"\n{kind}, {a.model}, max_new_tokens {a.max_new_tokens}, seeds {a.seeds} ({seconds:.0f} s):\n")
        print(rates.table())
        record[kind] = {"seconds": seconds, "total": rates.total().__dict__,
                        "runs": [r.__dict__ for r in rates.runs]}
    if a.out:
        a.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
