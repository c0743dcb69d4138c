"""README's labs table stays true: one row per released lab, its CPU and GPU points as the notebook grades them."""

from __future__ import annotations

import re

from autograder.learner.progress import graded_points


def test_labs_table_points(repo_root):
    section = (repo_root / "README.md").read_text().split("## Labs", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"(?m)^\| (\d\d) \| \[(\w+)\]\(labs/\w+/\) \| .+? \| .+? \| (\d+) \| (\d+) \|$", section)
    labs = sorted(p.parent.name for p in (repo_root / "labs").glob("*/*.ipynb"))
    assert [name for _, name, _, _ in rows] == labs, "README's labs table must list every released lab, in order"
    for _, name, cpu, gpu in rows:
        want_cpu, want_gpu = graded_points(next((repo_root / "labs" / name).glob("*.ipynb")))
        assert (int(cpu), int(gpu)) == (sum(want_cpu.values()), sum(want_gpu.values())), name
    total = re.search(r"\*\*all labs\*\* \| \| \*\*(\d+)\*\* \| \*\*(\d+)\*\*", section)
    assert total and (int(total[1]), int(total[2])) == (sum(int(r[2]) for r in rows), sum(int(r[3]) for r in rows))
