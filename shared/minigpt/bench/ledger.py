"""The benchmark's ledger (`data/bench/ledger.json`) and the Markdown table rendered from it.

A ledger holds what a reader needs to trust or redo a figure: the machine (processor, cores, load average before and
after), the versions, the settings, every raw sample, and the figures: each a value beside its baseline, the ratio,
and the goal it is held to. README's performance table is `render_table(ledger)`, kept between two markers
(`sync_readme`); a test keeps the committed README and the committed ledger in step. No test asserts a time.

Each part (batching, serving, speculative, structured) carries its own "notes" (how it was measured and why its
figures come out as they do), printed under the table, and "measured": the command, date and load of its run, printed
too when it was run apart from the rest (`--only`).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- bench:begin (python -m minigpt.bench --readme) -->", "<!-- bench:end -->"

__all__ = ["BEGIN", "END", "machine", "versions", "figure", "render_table", "sync_readme", "write", "read"]


def machine() -> dict[str, Any]:
    """Processor, cores and the 1-minute load average now."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"processor": model, "cores": os.cpu_count(), "system": platform.system(),
            "load_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def versions() -> dict[str, str]:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers
        found["transformers"] = transformers.__version__
    except ImportError:
        found["transformers"] = "not installed"
    return found


def figure(what: str, value: float, unit: str, *, against: str | None = None, baseline: float | None = None,
           higher_is_better: bool = True, goal: float | None = None, goal_of: str = "ratio") -> dict[str, Any]:
    """One row: `value` (in `unit`) and, with a baseline, ratio = how many times better than it (value / baseline
    when higher is better, baseline / value when lower is); `goal` is a floor on the ratio (or on the value itself
    with goal_of="value")."""
    row: dict[str, Any] = {"what": what, "value": value, "unit": unit}
    if against is not None and baseline is not None:
        row.update(against=against, baseline=baseline,
                   ratio=value / baseline if higher_is_better else baseline / value)
    if goal is not None:
        judged = row["ratio"] if goal_of == "ratio" else value
        row.update(goal=goal, goal_of=goal_of, met=bool(judged >= goal))
    return row


def _number(x: float, unit: str) -> str:
    if unit == "%":
        return f"{x:.0f}%"
    return f"{x:,.3g} {unit}" if abs(x) < 100 else f"{x:,.0f} {unit}"


def render_table(ledger: dict[str, Any]) -> str:
    """README's table: one row per figure, its baseline and ratio, its goal and whether it is met."""
    m = ledger["machine"]
    lines = [f"Measured by `make bench` on {ledger['date']}: {m['processor']}, {m['cores']} cores, "
             f"{ledger['settings']['threads']} thread(s), load {m['load_before']} before and {m['load_after']} after; "
             f"torch {ledger['versions']['torch']}, transformers {ledger['versions']['transformers']}. "
             f"Raw samples in `data/bench/ledger.json`.", "",
             "| figure | measured | against | ratio | goal |", "|---|---|---|---|---|"]
    for row in ledger["figures"]:
        against = (f"{row['against']}: {_number(row['baseline'], row['unit'])}" if "against" in row else "")
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else ""
        goal = ""
        if "goal" in row:
            target = f">= {row['goal']:g}x" if row["goal_of"] == "ratio" else f">= {_number(row['goal'], row['unit'])}"
            goal = f"{target} {'met' if row['met'] else '**not met**'}"
        lines.append(f"| {row['what']} | {_number(row['value'], row['unit'])} | {against} | {ratio} | {goal} |")
    profiles = ledger.get("batch1", {}).get("profile", {})
    if profiles:
        lines += ["", "Where a batch-1 step's time goes (torch.profiler, self time; aten calls counted with nested ones):"]
        for name, found in profiles.items():
            top = ", ".join(f"{t['op']} {t['self_share']:.0%} ({t['calls_per_step']:.0f} calls)" for t in found["top"][:3])
            lines.append(f"- {name}: {found['aten_calls_per_step']:,.0f} aten calls per step; {top}")
    parts = {name: part for name, part in ledger.items() if isinstance(part, dict) and "notes" in part}
    if parts:
        lines += ["", "How the other parts were measured, and why they come out as they do:"]
        for name, part in parts.items():
            m = part.get("measured", {})
            if m and m.get("command") != ledger.get("command"):
                lines.append(f"- {name} measured on its own, `{m['command']}` on {m['date']}, load {m['load_before']} "
                             f"before and {m['load_after']} after.")
            lines += [f"- {note}" for note in part["notes"]]
    return "\n".join(lines) + "\n"


def sync_readme(readme: Path, table: str, begin: str = BEGIN, end: str = END, what: str = "bench") -> bool:
    """Put `table` between README's markers (the bench's, or the `what` markers given); True if it changed."""
    text = readme.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{readme} has no {what} markers ({begin} ... {end})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{table}{end}{tail}"
    if new != text:
        readme.write_text(new)
    return new != text


def write(ledger: dict[str, Any], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ledger.json"
    path.write_text(json.dumps(ledger, indent=1) + "\n")
    (folder / "table.md").write_text(render_table(ledger))
    return path


def read(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "ledger.json").read_text())
