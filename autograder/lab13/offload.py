"""Exercise 4: load or recompute, the crossover prefix length from lab 00's arithmetic.

The learner's crossover_tokens(shape, link, accelerator, mfu=0.5, limit=2**20) must return the shortest prefix (in
tokens) at which loading its KV over the link (latency + bytes / bandwidth) takes less time than recomputing it
(prefill FLOPs / (peak bf16 * mfu)), or None when loading does not win even at `limit`. Compared exactly with the
package's on real shapes (GQA, MHA, MQA, the course's models), the three links of the lab and drawn links, several
accelerators and MFUs; likely mistakes named on hand-made cases. (Whether a tie loads or recomputes is not judged: no case lands on an exact
tie of two floating-point times.)
"""

from __future__ import annotations

import random
from typing import Any, Callable

from autograder.checking.reference_guard import own_work, watched
from autograder.harness import call_learner
from minigpt.costmodel import offload
from minigpt.costmodel.calculators import PRESETS, kv_bytes_per_token, prefill_flops
from minigpt.costmodel.hardware import ACCELERATORS
from minigpt.costmodel.offload import LINKS, Link, crossover_tokens

__all__ = ["check_crossover_tokens", "EX4"]

EX4 = "Exercise 4 (crossover_tokens)"
REFERENCES = (offload.crossover_tokens, offload.should_load, offload.load_seconds, offload.recompute_seconds)
LIMIT = 1 << 20


def _variant(shape: Any, link: Link, acc: Any, mfu: float, *, latency: bool = True, kv_factor: float = 1.0,
             last_recompute: bool = False) -> int | None:
    """A likely mistake's answer (a linear scan is enough on the hand-made cases, whose crossovers are small)."""
    def load(n: int) -> float:
        return (link.latency if latency else 0.0) + n * kv_bytes_per_token(shape) * kv_factor / link.bandwidth

    def recompute(n: int) -> float:
        return prefill_flops(shape, n) / (acc.peak("bf16") * mfu)
    for n in range(1, 200_000):
        if load(n) < recompute(n):
            return n - 1 if last_recompute else n
    return None


def _cases() -> list[tuple[str, Any, Link, Any, float, int]]:
    h100 = ACCELERATORS["H100-SXM"]
    cases = [(f"{s} over {l}, H100-SXM, mfu 0.5", PRESETS[s], LINKS[l], h100, 0.5, LIMIT)
             for s in ("minigpt-target", "minigpt-draft", "Llama-3-8B", "Llama-2-7B (MHA)")
             for l in ("PCIe 5.0 x16", "NVMe SSD (PCIe 4.0 x4)")]
    cases.append(("minigpt-target over an NVMe SSD, H100-SXM, mfu 0.5, limit 8192 tokens (loading wins only "
                  "beyond it)", PRESETS["minigpt-target"], LINKS["NVMe SSD (PCIe 4.0 x4)"], h100, 0.5, 8192))
    rng = random.Random(31)
    accs = sorted(ACCELERATORS)
    for i in range(12):
        link = Link(f"drawn link {i}", rng.choice((2e9, 8e9, 25e9, 64e9)), rng.choice((1e-6, 2e-5, 3e-4)), "drawn")
        shape = PRESETS[rng.choice(sorted(PRESETS))]
        acc = ACCELERATORS[rng.choice(accs)]
        mfu = rng.choice((0.2, 0.5, 0.8))
        cases.append((f"{shape.name} over a link of {link.bandwidth / 1e9:g} GB/s and {link.latency * 1e6:g} us, "
                      f"{acc.name}, mfu {mfu}", shape, link, acc, mfu, LIMIT))
    return cases


def check_crossover_tokens(fn: Callable) -> None:
    """fn(shape, link, accelerator, mfu=0.5, limit=2**20) == the package's crossover_tokens on every case."""
    own_work(fn, REFERENCES, what=EX4)
    fn = watched(fn, REFERENCES, EX4)
    for what, shape, link, acc, mfu, limit in _cases():
        want = crossover_tokens(shape, link, acc, mfu=mfu, limit=limit)
        got = call_learner(EX4, fn, shape, link, acc, mfu=mfu, limit=limit, context=what)
        if got == want and (got is None or (isinstance(got, int) and not isinstance(got, bool))):
            continue
        hint = ""
        if want is not None and want < 200_000:
            named = [(_variant(shape, link, acc, mfu, latency=False), "the load pays the link's latency once"),
                     (_variant(shape, link, acc, mfu, kv_factor=0.5), "both K and V are loaded: kv_bytes_per_token "
                                                                      "counts both"),
                     (_variant(shape, link, acc, mfu, last_recompute=True), "return the shortest prefix at which "
                                                                            "loading WINS, not the longest at which "
                                                                            "it loses")]
            hint = next((f": {msg}" for value, msg in named if got == value and value != want), "")
        if want is None and got is not None:
            hint = ": loading does not win even at `limit` tokens here; return None"
        raise AssertionError(f"{EX4}: {what}: returned {got!r}, expected {want!r}{hint}")
