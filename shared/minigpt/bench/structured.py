"""Structured generation's masks (lab 10) side by side with XGrammar and llguidance: same schemas, same tokenizer,
same decoding traces, one process, one thread.

Traces. For each schema of the part (a few of `data/structured/schemas.json`), the course's target writes one
document under constrained decoding (`generate_constrained`, masks from a `ContextCache`, forced text as its canonical
tokens, sampled at temperature 1 with a fixed seed); its token ids are the trace, and every engine walks the same ids.
A document a library refuses (the course's language is not exactly theirs: see the agreement note) is passed over
for the next seed, and the ledger says so. A regex (a name and an e-mail address) gives one trace more, for the DFAs.

Per-token mask time. Along a trace, at every step, each engine computes its mask once, in an order that rotates from
step to step; then each takes the trace's token (not timed). A pass walks the whole trace; pass 0 is the warm-up (the
course's cache fills there; llguidance builds its lexer states lazily too), then `passes` timed passes, and a step's
time is its median over them; per engine, the mean over every step of every trace, and the p99. Two groups, each
walked in passes of its own (a scan evicts the processor's caches, and interleaved with it the fast engines ran 2-4x
slower):

    JSON:  course ContextCache | XGrammar | llguidance | SERVER then  course ContextCache | mask_by_trie | mask_by_scan
    regex: course MaskIndex    | XGrammar | llguidance          then  course MaskIndex    | mask_by_trie | mask_by_scan

(the second group's course masks only check that the three course engines give one mask at every step). SERVER is
the course server's default backend as its engine calls it (`minigpt.serving.llguidance_backend`, llguidance behind a
`GrammarConstraint`): the same library, its mask a (V,) bool tensor (the packed bits unpacked), the form the engine's
logits processor applies, and each state a copy of the compiled matcher.

Compile time per schema, interleaved, median over `compile_repeats`: the course's `compile_json_schema` + a
`ContextCache` (plus its warm-up: pass 0's mask time, reported apart and added), XGrammar's
`GrammarCompiler(max_threads=1, cache_enabled=False).compile_json_schema`, llguidance's `LLMatcher` init, and the
server's `compile_grammar(json_schema_grammar(schema))` (its first mask included, as the server computes it before
the request joins the batch).

End to end: `generate_constrained` with the (warm) cache's masks against the same loop with `constrain=False`,
greedy after the same prompt, interleaved by `minigpt.timing.compare`: seconds per decode step (forward pass).

Goals (issue 35): the course's mean mask no worse than 2x the faster library's; at least 20x faster than the
naive scan; masks add at most 10% to a decode step. No test asserts a time.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from minigpt.bench import mask_engines as me
from minigpt.bench.ledger import figure
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.llguidance_backend import llguidance_tokenizer_of
from minigpt.structured.constrained import generate_constrained
from minigpt.structured.evaluation import SuiteSchema, llguidance_tokenizer, load_suite, xgrammar_tokenizer_info
from minigpt.structured.token_masks import TokenTrie, Vocabulary, mask_by_scan, mask_by_trie
from minigpt.timing import compare, fixed_threads

__all__ = ["SERVER", "JSON_ENGINES", "REGEX_ENGINES", "settings", "trace", "time_masks", "side_by_side",
           "measure_structured", "summarize", "figures", "notes"]

SERVER = "the server's default: llguidance as (V,) bool"      # the course server's backend, as its engine calls it
JSON_ENGINES = ("course ContextCache", "XGrammar", "llguidance", SERVER, "mask_by_trie", "mask_by_scan")
REGEX_ENGINES = ("course MaskIndex", "XGrammar", "llguidance", "mask_by_trie", "mask_by_scan")
LIBRARIES = ("XGrammar", "llguidance")
LIBRARY_GOAL, SCAN_GOAL, DECODE_GOAL = 0.5, 20.0, 1 / 1.1     # floors on the ratios (see `figures`)
REGEX = {"name": "name and e-mail", "prompt": "Contact: ",
         "pattern": r"[A-Z][a-z]{1,11} [A-Z][a-z]{1,11} <[a-z0-9._]+@[a-z0-9]+\.(com|org|net)>"}


def settings(quick: bool, threads: int = 1) -> dict[str, Any]:
    """Six schemas, 5 timed passes, up to 96 tokens a trace (quick: two schemas, 2 passes, 48 tokens)."""
    return {"model": "target", "schemas": ["settings", "api_result"] if quick else
            ["settings", "api_result", "order", "todo", "weather_call", "linked_list"],
            "regex": REGEX, "max_new_tokens": 48 if quick else 96, "temperature": 1.0, "seed": 0,
            "passes": 2 if quick else 5, "compile_repeats": 3 if quick else 5, "decode_repeats": 2 if quick else 3,
            "threads": threads, "xgrammar_threads": 1}


def trace(model: GPT, tokenizer: Any, automaton: Any, masks: Callable[[Any], torch.Tensor], trie: TokenTrie,
          prompt: str, *, max_new_tokens: int, temperature: float, seed: int, forced: bool) -> dict[str, Any]:
    """One document under constrained decoding: its token ids, text and why it stopped; `forced` (grammars only):
    the grammar's forced text taken as its own tokens (encoded alone)."""
    out = generate_constrained(model, tokenizer.encode(prompt), automaton, trie, max_new_tokens=max_new_tokens,
                               sampling=SamplingParams(temperature=temperature, seed=seed), masks=masks,
                               forced=tokenizer.encode if forced else None)
    return {"tokens": out.tokens, "text": out.text, "stopped": out.stopped, "forced_tokens": out.forced_tokens}


def _common_trace(write: Callable[[int], dict[str, Any]], libraries: Sequence[Any], trie: TokenTrie, seed: int,
                  tries: int = 5) -> dict[str, Any]:
    """The first trace, seed after seed, that every library takes whole: the course's masks admit documents a
    library refuses (an escape in a length-bounded string for XGrammar, a forced text tokenized otherwise than
    canonically for llguidance); the seeds passed over are kept, with why."""
    skipped = []
    for k in range(tries):
        found = write(seed + k)
        try:
            for library in libraries:
                library.reset()
                for token in found["tokens"]:
                    library.advance(token)
        except RuntimeError as refused:
            skipped.append({"seed": seed + k, "why": f"{refused}, {trie.vocab.texts[token]!r}", "text": found["text"]})
            continue
        finally:
            for library in libraries:
                library.reset()
        return {**found, "seed": seed + k, "skipped": skipped}
    raise RuntimeError(f"no trace every library takes in seeds {seed}..{seed + tries - 1}: {skipped}")


def time_masks(engines: dict[str, Any], tokens: Sequence[int], *, ended: bool, passes: int,
               reference: str) -> dict[str, Any]:
    """Walk `tokens` passes + 1 times (pass 0: warm-up); per engine, each step's median mask seconds over the timed
    passes and pass 0's seconds; on the last pass, the steps where an engine's mask allows more than `reference`'s
    and where it allows fewer (tokens with a text only: llguidance also allows pieces of a multi-byte character,
    which the course never does).
    A mask is timed at the state before each token, and after the last one when the document ended there. The
    garbage collector is off while timing (collected between passes), so one engine's garbage is not paid by another.
    Raises if a course engine's mask differs from `reference`'s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _walk(engines, tokens, ended=ended, passes=passes, reference=reference)
    finally:
        if enabled:
            gc.enable()


def _walk(engines: dict[str, Any], tokens: Sequence[int], *, ended: bool, passes: int,
          reference: str) -> dict[str, Any]:
    names = list(engines)
    steps = len(tokens) + (1 if ended else 0)
    cold: dict[str, list[float]] = {n: [] for n in names}
    warm: dict[str, list[list[float]]] = {n: [[] for _ in range(steps)] for n in names}
    differ = {n: {"more": 0, "fewer": 0} for n in names}         # steps where it allows a token the reference refuses,
                                                                   # refuses one the reference allows
    has_text = np.array([t is not None for t in engines[reference].texts])
    for p in range(passes + 1):
        gc.collect()
        for engine in engines.values():
            engine.reset()
        for i in range(steps):
            k = (i + p) % len(names)
            for name in names[k:] + names[:k]:
                start = time.perf_counter()
                engines[name].mask()
                seconds = time.perf_counter() - start
                (cold[name].append(seconds) if p == 0 else warm[name][i].append(seconds))
            if p == passes:
                want = engines[reference].allowed()
                for name in names:
                    got = engines[name].allowed()
                    differ[name]["more"] += bool((got & ~want & has_text).any())
                    differ[name]["fewer"] += bool((~got & want & has_text).any())
            if i < len(tokens):
                for engine in engines.values():
                    engine.advance(tokens[i])
    if bad := [n for n in names if any(differ[n].values()) and isinstance(engines[n], me.CourseEngine)]:
        raise RuntimeError(f"{', '.join(bad)} gave other masks than {reference} on the same states")
    return {"step_s": {n: [statistics.median(s) for s in warm[n]] for n in names}, "first_pass_s": cold,
            "steps_differing": differ, "steps": steps}


def side_by_side(built: dict[str, Any], course: str, found: dict[str, Any], trie: TokenTrie, *,
                 passes: int) -> dict[str, Any]:
    """`time_masks` for the course engine and the libraries, then in passes of their own for the trie walk and the
    scan (with the course engine again as the reference they must equal); one record, per engine."""
    automaton, vocab = built["course"].automaton, trie.vocab
    fast = {course: built["course"], **{name: built[name] for name in (*LIBRARIES, SERVER) if name in built}}
    slow = {course: built["course"],
            "mask_by_trie": me.CourseEngine(automaton, lambda st: mask_by_trie(automaton, st, trie), trie),
            "mask_by_scan": me.CourseEngine(automaton, lambda st: mask_by_scan(automaton, st, vocab), trie)}
    kw = {"ended": found["stopped"] == "end", "passes": passes, "reference": course}
    a, b = time_masks(fast, found["tokens"], **kw), time_masks(slow, found["tokens"], **kw)
    merged = {key: {**a[key], **{n: v for n, v in b[key].items() if n != course}}
              for key in ("step_s", "first_pass_s", "steps_differing")}
    return {**merged, "steps": a["steps"], "course_beside_baselines_s": b["step_s"][course]}


def _compile(builders: dict[str, Callable[[], Any]], repeats: int, threads: int) -> tuple[dict[str, list[float]],
                                                                                        dict[str, Any]]:
    """Each builder timed `repeats` times, interleaved (after one warm-up call); the last engine each built."""
    built: dict[str, Any] = {}
    timed = compare({name: lambda name=name, build=build: built.__setitem__(name, build())
                     for name, build in builders.items()}, warmup=1, repeats=repeats, threads=threads)
    return {name: t.samples for name, t in timed.items()}, built


def _decode_overhead(model: GPT, tokenizer: Any, grammar: Any, masks: Callable[[Any], torch.Tensor], trie: TokenTrie,
                     prompt: str, *, max_new_tokens: int, repeats: int, threads: int) -> dict[str, Any]:
    """Seconds per decode step with the masks and without, greedy, same prompt; the masks' own seconds inside (of
    the last run)."""
    ids = tokenizer.encode(prompt)
    kw = {"max_new_tokens": max_new_tokens}
    generate_constrained(model, ids, grammar, trie, masks=masks, **kw)       # the cache now holds this path's segments
    outs: dict[str, Any] = {}
    runs = {"with masks": lambda: outs.__setitem__("with masks", generate_constrained(
                model, ids, grammar, trie, masks=masks, **kw)),
            "without masks": lambda: outs.__setitem__("without masks", generate_constrained(
                model, ids, grammar, trie, constrain=False, **kw))}
    t = compare(runs, warmup=0, repeats=repeats, threads=threads)
    return {name: {"seconds": t[name].median, "samples_s": t[name].samples, "steps": outs[name].forward_passes,
                   "mask_seconds": outs[name].mask_seconds, "model_seconds": outs[name].model_seconds,
                   "tokens": len(outs[name].tokens)} for name in runs}


@torch.inference_mode()
def measure_structured(model: GPT, *, quick: bool, threads: int = 1, tokenizer: Any = None,
                       suite: Sequence[SuiteSchema] | None = None, overrides: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
    """The ledger section: traces, per-step mask times, compile times, decode overhead (see the module docstring).
    `overrides` replaces settings (the tests run one schema, few tokens, one pass)."""
    import xgrammar

    from minigpt.tokenizer import load_tokenizer

    s = {**settings(quick, threads), **(overrides or {})}
    tokenizer = tokenizer or load_tokenizer()
    by_name = {e.name: e for e in (suite or load_suite())}
    trie = TokenTrie(Vocabulary.from_tokenizer(tokenizer))
    size = len(trie.vocab)
    compiler = xgrammar.GrammarCompiler(xgrammar_tokenizer_info(tokenizer), max_threads=s["xgrammar_threads"],
                                        cache_enabled=False)
    lltok = llguidance_tokenizer(tokenizer)
    served = llguidance_tokenizer_of(tokenizer)
    gen = {"max_new_tokens": s["max_new_tokens"], "temperature": s["temperature"]}
    section: dict[str, Any] = {"settings": s, "vocab_size": size, "schemas": {}}
    with fixed_threads(threads):
        for name in s["schemas"]:
            entry = by_name[name]
            compile_s, built = _compile({
                "course": lambda e=entry: me.compile_course_json(e.schema, trie),
                "XGrammar": lambda e=entry: me.compile_xgrammar_json(compiler, e.schema, size),
                "llguidance": lambda e=entry: me.compile_llguidance_json(lltok, e.schema, size),
                SERVER: lambda e=entry: me.compile_server_json(served, e.schema)},
                s["compile_repeats"], threads)
            grammar = built["course"].automaton
            writing = me.compile_course_json(entry.schema, trie).masks          # a cache of its own: built's stays cold
            found = _common_trace(lambda seed: trace(model, tokenizer, grammar, writing, trie, entry.prompt,
                                                     forced=True, seed=seed, **gen),
                                  [built["XGrammar"], built["llguidance"], built[SERVER]], trie, s["seed"])
            masks = side_by_side(built, "course ContextCache", found, trie, passes=s["passes"])
            decode = _decode_overhead(model, tokenizer, grammar, built["course"].masks, trie, entry.prompt,
                                      max_new_tokens=s["max_new_tokens"], repeats=s["decode_repeats"], threads=threads)
            section["schemas"][name] = {"trace": found, "compile_s": compile_s, **masks, "decode": decode,
                                        "warmup_s": sum(masks["first_pass_s"]["course ContextCache"])}
        pattern = s["regex"]["pattern"]
        compile_s, built = _compile({"course": lambda: me.compile_course_regex(pattern, trie),
                                     "XGrammar": lambda: me.compile_xgrammar_regex(compiler, pattern, size),
                                     "llguidance": lambda: me.compile_llguidance_regex(lltok, pattern, size)},
                                    s["compile_repeats"], threads)
        dfa = built["course"].automaton
        found = _common_trace(lambda seed: trace(model, tokenizer, dfa, built["course"].masks, trie,
                                                 s["regex"]["prompt"], forced=False, seed=seed, **gen),
                              [built["XGrammar"], built["llguidance"]], trie, s["seed"])
        section["regex"] = {"trace": found, "compile_s": compile_s, "live_states": len(dfa.live_states),
                            **side_by_side(built, "course MaskIndex", found, trie, passes=s["passes"])}
    section["summary"] = summarize(section)
    return section


def _pool(parts: Sequence[dict[str, Any]], engines: Sequence[str]) -> dict[str, dict[str, float]]:
    """Mean and p99 of the per-step medians over every step of `parts`, per engine, and pass 0's mean."""
    out = {}
    for name in engines:
        steps = [x for p in parts for x in p["step_s"][name]]
        first = [x for p in parts for x in p["first_pass_s"][name]]
        out[name] = {"mean_s": float(np.mean(steps)), "p99_s": float(np.percentile(steps, 99)),
                     "first_pass_mean_s": float(np.mean(first)), "steps": len(steps)}
    return out


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """What the rows read: pooled mask times, per-schema compile medians, decode seconds per step."""
    schemas = section["schemas"]
    compile_ms = {}
    for name, sch in schemas.items():
        med = {engine: statistics.median(samples) for engine, samples in sch["compile_s"].items()}
        compile_ms[name] = {"course": med["course"], "course + warm-up": med["course"] + sch["warmup_s"],
                            "XGrammar": med["XGrammar"], "llguidance": med["llguidance"], SERVER: med[SERVER]}
    decode = {kind: sum(sch["decode"][kind]["seconds"] for sch in schemas.values()) /
              sum(sch["decode"][kind]["steps"] for sch in schemas.values()) for kind in ("with masks", "without masks")}
    constrained = [sch["decode"]["with masks"] for sch in schemas.values()]
    mask_s = sum(c["mask_seconds"] for c in constrained)
    return {"json": _pool(list(schemas.values()), JSON_ENGINES), "regex": _pool([section["regex"]], REGEX_ENGINES),
            "compile_s": {engine: statistics.median(c[engine] for c in compile_ms.values())
                          for engine in ("course", "course + warm-up", "XGrammar", "llguidance", SERVER)},
            "compile_per_schema_s": compile_ms,
            "regex_compile_s": {e: statistics.median(v) for e, v in section["regex"]["compile_s"].items()},
            "decode_step_s": decode, "mask_s_per_step": mask_s / sum(c["steps"] for c in constrained),
            "mask_share_of_constrained_step": mask_s / sum(c["seconds"] for c in constrained)}


def figures(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows: mask time per token against the faster library (goal) and the naive scan (goal), p99, the
    regex's index, compile time per schema, and the decode step with and without masks (goal)."""
    sm = section["summary"]
    us = 1e6
    rows = []
    for kind, course, label in (("json", "course ContextCache", f"{len(section['schemas'])} JSON schemas"),
                                ("regex", "course MaskIndex", "a regex")):
        t = sm[kind]
        fast = min(LIBRARIES, key=lambda lib: t[lib]["mean_s"])
        what = f"structured: mask per token, {label} ({t[course]['steps']} steps): {course}"
        rows.append(figure(f"{what}, mean", t[course]["mean_s"] * us, "µs", against=f"{fast} (the faster library)",
                           baseline=t[fast]["mean_s"] * us, higher_is_better=False, goal=LIBRARY_GOAL))
        rows.append(figure(f"{what}, p99", t[course]["p99_s"] * us, "µs", against=f"{fast}, p99",
                           baseline=t[fast]["p99_s"] * us, higher_is_better=False))
        rows.append(figure(f"{what}, mean", t[course]["mean_s"] * us, "µs", against="mask_by_scan (the naive scan)",
                           baseline=t["mask_by_scan"]["mean_s"] * us, higher_is_better=False, goal=SCAN_GOAL))
        rows.append(figure(f"{what}, mean", t[course]["mean_s"] * us, "µs", against="mask_by_trie",
                           baseline=t["mask_by_trie"]["mean_s"] * us, higher_is_better=False))
        other = next(lib for lib in LIBRARIES if lib != fast)
        rows.append(figure(f"structured: mask per token, {label}: {other}, mean", t[other]["mean_s"] * us, "µs",
                           against=fast, baseline=t[fast]["mean_s"] * us, higher_is_better=False))
        if SERVER in t:
            rows.append(figure(f"structured: mask per token, {label}: {SERVER}, mean", t[SERVER]["mean_s"] * us, "µs",
                               against=course, baseline=t[course]["mean_s"] * us, higher_is_better=False))
    c = sm["compile_s"]
    fast = min(LIBRARIES, key=lambda lib: c[lib])
    other = next(lib for lib in LIBRARIES if lib != fast)
    for engine, label in (("course + warm-up", "course: compile_json_schema + ContextCache + its warm-up"),
                          ("course", "course: compile_json_schema + ContextCache"), (other, other)):
        rows.append(figure(f"structured: compile per schema (median of {len(sm['compile_per_schema_s'])}): {label}",
                           c[engine] * 1e3, "ms", against=fast, baseline=c[fast] * 1e3, higher_is_better=False))
    if SERVER in c:
        rows.append(figure(f"structured: compile per schema (median of {len(sm['compile_per_schema_s'])}): {SERVER} "
                           "(grammar, matcher, first mask)", c[SERVER] * 1e3, "ms",
                           against="course: compile_json_schema + ContextCache", baseline=c["course"] * 1e3,
                           higher_is_better=False))
    rc = sm["regex_compile_s"]
    fast = min(LIBRARIES, key=lambda lib: rc[lib])
    rows.append(figure(f"structured: compile a regex: course RegexAutomaton + MaskIndex "
                       f"({section['regex']['live_states']} live states)", rc["course"] * 1e3, "ms", against=fast,
                       baseline=rc[fast] * 1e3, higher_is_better=False))
    d = sm["decode_step_s"]
    rows.append(figure("structured: decode step of the target with masks (warm ContextCache), at most 10% added",
                       d["with masks"] * 1e3, "ms", against="the same loop without masks",
                       baseline=d["without masks"] * 1e3, higher_is_better=False, goal=round(DECODE_GOAL, 3)))
    return rows


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds >= 1e-5 else f"{seconds * 1e6:.1f} µs"


def _more_fewer(sch: dict[str, Any], engine: str) -> str:
    d = sch["steps_differing"][engine]
    return f"{d['more']} / {d['fewer']}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _served(j: dict[str, Any]) -> str:
    if SERVER not in j:
        return ""
    extra = j[SERVER]["mean_s"] - j["llguidance"]["mean_s"]
    return (f", and as the course server's engine takes it (the same library behind a `GrammarConstraint`, its bits "
            f"unpacked into a (V,) bool tensor) {_us(j[SERVER]['mean_s'])}, {_us(abs(extra))} "
            f"{'more' if extra >= 0 else 'less'}")


def _served_compile(sm: dict[str, Any]) -> str:
    c = sm["compile_s"]
    return (f"; the server's compile, its JSON options, the matcher and its first mask, {1e3 * c[SERVER]:.2f} ms"
            if SERVER in c else "")


def notes(section: dict[str, Any]) -> list[str]:
    """How the part was measured and why its figures come out as they do."""
    s, sm = section["settings"], section["summary"]
    j, r, d = sm["json"], sm["regex"], sm["decode_step_s"]
    traces = ", ".join(f"{name} {len(sch['trace']['tokens'])} tokens ({sch['trace']['stopped']}, seed "
                       f"{sch['trace']['seed']})" for name, sch in section["schemas"].items())
    skipped = [f"{name} seed {k['seed']} ({k['why']})" for name, sch in [*section["schemas"].items(),
                                                                         ("regex", section["regex"])]
               for k in sch["trace"]["skipped"]]
    rt = section["regex"]["trace"]
    lines = [
        f"structured: traces written by the target under constrained decoding (temperature {s['temperature']}, seed "
        f"{s['seed']}, forced text as canonical tokens so llguidance takes every id): {traces}; regex "
        f"`{s['regex']['pattern']}` {len(rt['tokens'])} tokens ({rt['stopped']}, seed {rt['seed']}); passed over "
        f"because a library refuses the document: {'; '.join(skipped) or 'none'}. Every engine walks the same ids; "
        f"per step each engine's mask once, order rotating, pass 0 a warm-up, median of {s['passes']} passes; one "
        f"torch thread, XGrammar's compiler at max_threads=1 (its default is 8), llguidance's mask in the calling "
        f"thread; vocabulary {section['vocab_size']:,} tokens. The goals as ratios: >= 0.5x against the faster "
        "library (no worse than 2x its time), >= 20x against the scan, >= 0.909x for the decode step (at most 10% "
        "added).",
        f"structured, why the masks cost what they do: the course's ContextCache is Python: per mask it ORs one "
        f"cached (V,) bool pair per stack of the state and walks the few uncertain tokens against the whole state "
        f"({_us(j['course ContextCache']['mean_s'])} mean, p99 {_us(j['course ContextCache']['p99_s'])}); XGrammar "
        f"(C++, token masks of every rule position made at compile time) {_us(j['XGrammar']['mean_s'])}, llguidance "
        f"(Rust, a lexer DFA walked over a token trie at each step) {_us(j['llguidance']['mean_s'])}{_served(j)}. "
        f"The vocabulary is {section['vocab_size']:,} tokens, 1/32 of a 128k tokenizer's: what grows with it (the "
        "libraries' trie walks and bitsets, the course's (V,) tensors) is small here, so fixed costs (a Python call, "
        "a state's bookkeeping) weigh more than they would at 128k. The trie walk "
        f"({_us(j['mask_by_trie']['mean_s'])}) and the scan ({_us(j['mask_by_scan']['mean_s'])}) run the pushdown "
        "recognizer per character in Python at every step. For a regex the course's MaskIndex is a row lookup "
        f"({_us(r['course MaskIndex']['mean_s'])}), its work done at compile time, one trie walk per live state "
        f"({section['regex']['live_states']} states, {1e3 * sm['regex_compile_s']['course']:,.0f} ms).",
        f"structured, compile: XGrammar computes every rule position's token masks at compile time "
        f"({1e3 * sm['compile_s']['XGrammar']:.1f} ms median a schema; bounded strings make the most positions), "
        f"llguidance only builds its parser ({1e3 * sm['compile_s']['llguidance']:.2f} ms) and computes lazily "
        f"(first pass {_us(j['llguidance']['first_pass_mean_s'])} a mask against {_us(j['llguidance']['mean_s'])} "
        f"warm{_served_compile(sm)}); the course compiles in {1e3 * sm['compile_s']['course']:.1f} ms and fills its "
        f"cache at the first masks, one trie walk per new rule position: "
        f"{1e3 * sm['compile_s']['course + warm-up']:.0f} ms with the warm-up along one trace, and more where a later "
        f"document reaches new positions (a string with maxLength n has a rule per count, so up to n positions; "
        f"first pass {_us(j['course ContextCache']['first_pass_mean_s'])} a mask).",
        "structured, agreement on the last pass (steps where a library's mask allows more / fewer tokens than the "
        "course's, tokens with a text): "
        + "; ".join(f"{name}: XGrammar {_more_fewer(sch, 'XGrammar')}, llguidance {_more_fewer(sch, 'llguidance')} "
                    f"of {sch['steps']}" for name, sch in section["schemas"].items())
        + ". XGrammar 0.2.8 admits raw control characters and no escape in length-bounded strings (pinned by "
        "test_xgrammars_bounded_strings_differ_where_json_says_so); llguidance admits only the canonical tokens of "
        "forced text, and refuses a raw DEL (U+007F, which JSON allows unescaped).",
        f"structured, end to end: greedy decoding after each schema's prompt, {_ms(d['with masks'])} a decode step "
        f"with the warm cache's masks against {_ms(d['without masks'])} without: {_ms(sm['mask_s_per_step'])} of "
        f"masks a step ({sm['mask_share_of_constrained_step']:.0%} of the constrained loop's time), the rest of the "
        f"difference ({_ms(d['with masks'] - d['without masks'] - sm['mask_s_per_step'])}) is the pushdown state "
        "advanced by each token's characters in Python, the mask applied, and noise. A schema's first document pays "
        "the cold cache (the warm-up above) on top.",
        "structured, published context: llguidance's README states about 50 µs of single-core CPU time per mask for "
        "a 128k-token tokenizer on JSON-schema grammars, with no significant startup cost (pypi.org/project/"
        "llguidance/1.9.1); MaskBench (JSONSchemaBench's mask-only benchmark, github.com/guidance-ai/jsonschemabench"
        "/tree/main/maskbench) runs every engine single-threaded, XGrammar with one thread per sequence, and reports "
        "XGrammar's time to first mask 3-4 orders of magnitude above llguidance's.",
    ]
    return lines
