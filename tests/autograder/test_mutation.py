"""Mutation testing of the checks (autograder/mutation/): the mutants, and a seeded sample of lab 00 that the checks
must kill, so that a check weakened later fails the suite."""

from __future__ import annotations

import pytest

from autograder.mutation import run as mutation
from autograder.mutation.mutants import mutants_of, solution_lines

CELL = '''import math
import torch

@torch.inference_mode()
def attend(q, k, v, mask):
    ### BEGIN SOLUTION
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(mask, float("-inf"))
    try:
        out = torch.softmax(s.float(), dim=-1).to(torch.float16) @ v.contiguous()
    except Exception:
        raise
    return out
    ### END SOLUTION
'''


def test_only_the_solution_lines_are_mutated():
    lines = solution_lines(CELL)
    assert lines == set(range(7, 14))
    assert {mu.line for mu in mutants_of(CELL, "ex1_code")} <= lines


def test_the_course_operators_and_decorated_functions():
    """mutmut skips decorated functions (its trampolines); the course's cells are often decorated (inference_mode,
    triton.jit), so they are mutated here, and the course's own kinds are among the mutants."""
    mutants = mutants_of(CELL, "ex1_code")
    kinds = {mu.kind for mu in mutants}
    assert {"mutmut", "drop .contiguous()", "drop .float()", "-inf -> -1e4", "dtype swap",
            "Exception -> BaseException"} <= kinds
    diffs = {mu.diff_line(CELL) for mu in mutants}
    assert '8: s = s.masked_fill(mask, float("-inf"))  ->  s = s.masked_fill(mask, -1e4)' in diffs
    assert any("@ v" in d and "contiguous" not in d.split("->")[1] for d in diffs)
    for mu in mutants:
        compile(mu.source, "cell", "exec")
        assert mu.source != CELL


KERNEL_CELL = '''def launch(x, slot, BLOCK_M=32, BLOCK_N=32, BLOCK_TABLES=None):
    ### BEGIN SOLUTION
    try:
        hi = min(x, BLOCK_M)
    except BaseException:
        slot.free()
        raise
    return hi + BLOCK_N
    ### END SOLUTION
'''


def test_tile_sizes_swapped_and_cleanup_narrowed():
    """A loop bound written with the wrong block size (invisible while the tiles are equal) and a cleanup that
    runs on Exception only (a cancelled request keeps its slot): both kinds are generated, tile names only among
    tile names (BLOCK_TABLES is a pointer, not a tile)."""
    diffs = {mu.diff_line(KERNEL_CELL) for mu in mutants_of(KERNEL_CELL, "ex1_code")
             if mu.kind in ("tile size swap", "BaseException -> Exception")}
    assert diffs == {"4: hi = min(x, BLOCK_M)  ->  hi = min(x, BLOCK_N)", "8: return hi + BLOCK_N  ->  return hi + BLOCK_M",
                     "5: except BaseException:  ->  except Exception:"}


def test_mutant_ids_are_stable_and_unique():
    first, second = mutants_of(CELL, "ex1_code"), mutants_of(CELL, "ex1_code")
    assert [mu.id for mu in first] == [mu.id for mu in second]
    assert len({mu.id for mu in first}) == len(first)


def _run_in_a_fresh_process(code: str, repo_root) -> dict:
    """run_lab forks one child per mutant: it runs in a process of its own, not in a pytest worker with threads."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", "import json, sys\nfrom autograder.mutation import run\n" + code +
                           "\nprint(json.dumps({'killed': r.killed, 'survived': r.survived, 'outcome': r.outcome, "
                           "'baseline': r.baseline_failures}))"],
                          cwd=repo_root, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_a_seeded_sample_of_lab00_mutants_is_killed(repo_root):
    """Four mutants of lab 00, drawn from those known/ lists neither as equivalent nor as surviving: its checks
    kill each one, and the solution itself passes every check. One of the four (`b += 1` -> `b = 1` in Exercise 9's
    climbing loop) loops for ever on the check's batch that the closed form puts one below the answer: killed by a
    hang, which the 30 s limit reports (the others are decided in about a second)."""
    r = _run_in_a_fresh_process("r = run.run_lab('00_token_factory', sample=4, seed=1, timeout_s=30, log=print, "
                                "exercises=['ex2_code', 'ex3_code', 'ex5_code', 'ex8_code', 'ex9_code'])", repo_root)
    assert r["baseline"] == []
    assert len(r["killed"]) == 4 and r["survived"] == {}, r["survived"]
    assert {kind for kind, _ in r["outcome"].values()} <= {"check", "crash", "hang"}, r["outcome"]


@pytest.mark.timeout(600)
def test_a_weakened_check_lets_mutants_through(repo_root):
    """The same kind of sample with lab 00's parameter count check made to pass anything: mutants survive, so the
    sample test above would fail."""
    r = _run_in_a_fresh_process("from autograder import lab00\n"
                                "lab00.check_count_parameters = lambda *args, **kwargs: None\n"
                                "r = run.run_lab('00_token_factory', sample=3, seed=0, timeout_s=120, log=print, "
                                "exercises=['ex2_code'])", repo_root)
    assert len(r["survived"]) == 3


def test_the_run_keeps_torch_on_one_thread():
    """Inside a run torch.set_num_threads does nothing (OpenMP's workers do not survive fork(): a child that asked
    for two threads after the parent ran on two hung, and its mutant counted as killed); afterwards it works again."""
    import torch

    from autograder.mutation.run import _one_thread

    before = torch.get_num_threads()
    with _one_thread():
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    torch.set_num_threads(before)


def test_gpu_only_exercises_are_reported_apart(tmp_path):
    """known/'s gpu_only exercises are not run without a GPU, and the report says how many mutants that leaves."""
    import json

    from autograder.mutation.report import markdown
    from autograder.mutation.run import LabResult, load_known

    (tmp_path / "01_kv_cache.json").write_text(json.dumps({"gpu_only": {"ex4_code": "a CUDA graph"}}))
    assert load_known("01_kv_cache", tmp_path)["gpu_only"] == {"ex4_code": "a CUDA graph"}
    report = markdown([LabResult("01_kv_cache", not_run={"ex4_code": 30})])
    assert "not run without a GPU" in report and "ex4_code (30 mutants)" in report


def test_scores_count_checks_and_crashes_and_keep_interview_cells_apart():
    """A broken run (the check failed on its own) is no kill; exercises and interview answers are scored apart."""
    from autograder.mutation.report import markdown
    from autograder.mutation.run import LabResult

    r = LabResult("00_token_factory", outcome={"ex1_code:1:a": ("check", "ex1_check: AssertionError"),
                                               "ex1_code:2:b": ("crash", "ex1_check: TypeError"),
                                               "ex1_code:3:c": ("broken", "ex1_check: NameError"),
                                               "ex1_code:4:d": ("survived", "[mutmut] 4: a -> b"),
                                               "q1_code:1:e": ("check", "q1_check: AssertionError")},
                  equivalent={"ex1_code:5:f": "shown"})
    assert r.score(interview=False) == 0.5 and r.score(interview=True) == 1.0
    table = markdown([r])
    assert "| 00_token_factory | exercises | 4 | 1 | 0 | 1 | 1 | 0 | 1 | 1 | 50.0% |" in table
    assert "broken runs" in table and "ex1_code:3:c" in table


def test_no_known_entry_is_stale():
    """Every entry of known/ names a mutant of today's solution cells (or a GPU-only exercise): an entry left behind
    by a changed cell would be taken for a shown or known one. The cells the entries were checked against are
    fingerprinted in known/ (`python -m autograder mutation --lab NN --check-known`); a changed cell's entries are
    checked here, mutant by mutant, and the fingerprint must then be recorded again."""
    from autograder.mutation.run import SOLUTIONS, changed_cells, stale_entries

    changed = {lab.name: changed_cells(lab.name) for lab in sorted(SOLUTIONS.iterdir()) if lab.is_dir()}
    stale = {lab: stale_entries(lab, only=cells) for lab, cells in changed.items() if cells}
    assert not any(stale.values()), {lab: found for lab, found in stale.items() if found}
    assert not any(changed.values()), ("cells changed since known/ was checked; no entry is stale, so record them: "
                                       f"python -m autograder mutation --check-known --lab ...: {changed}")


def test_every_listed_equivalent_exercise_mutant_has_a_contract():
    """An exercise mutant listed as equivalent is shown so by a differential test, which needs the exercise's
    contract (autograder/mutation/contracts/); interview answer cells are compared value by value."""
    from autograder.mutation.contracts import contract_for
    from autograder.mutation.run import SOLUTIONS, is_interview, load_known

    missing = [f"{lab.name} {mid}" for lab in sorted(SOLUTIONS.iterdir()) if lab.is_dir()
               for mid in load_known(lab.name)["equivalent"]
               if not is_interview(mid) and contract_for(lab.name, mid.split(":")[0]) is None]
    assert not missing, missing


STUDENT_CELL = '''def step(q, k, v, out, n, d):
    ### BEGIN SOLUTION
    s = q @ k.transpose(-2, -1)
    keep = torch.zeros(n, device=q.device)
    for i in range(n):
        out[i] += s[i].sum(dim=d)
    out.add_(1)
    return torch.cat([out[: n - 1], v.T], 0)
    ### END SOLUTION
'''


def test_the_operators_write_students_bugs():
    """Issue 57's kinds, each on a line of its own: a statement left out, two arguments swapped, a bound that is
    not a literal moved by one, a shape op dropped, a reduction dim held in a variable moved, in place <-> copy,
    a tensor made on the CPU; modules' functions are never made `_` methods (math.sqrt_ does not exist)."""
    diffs = {(mu.kind, mu.diff_line(STUDENT_CELL)) for mu in mutants_of(STUDENT_CELL, "ex1_code")}
    for kind, line in [
            ("statement deleted", "7: out.add_(1)  ->  pass"),
            ("arguments swapped", "3: s = q @ k.transpose(-2, -1)  ->  s = q @ k.transpose(-1, -2)"),
            ("off by one", "5: for i in range(n):  ->  for i in range(n - 1):"),
            ("off by one", "8: return torch.cat([out[: n - 1], v.T], 0)  ->  return torch.cat([out[: (n - 1) + 1], v.T], 0)"),
            ("off by one", "6: out[i] += s[i].sum(dim=d)  ->  out[i + 1] += s[i].sum(dim=d)"),
            ("shape op dropped", "3: s = q @ k.transpose(-2, -1)  ->  s = q @ k"),
            ("shape op dropped", "8: return torch.cat([out[: n - 1], v.T], 0)  ->  return torch.cat([out[: n - 1], v], 0)"),
            ("reduction dim moved", "6: out[i] += s[i].sum(dim=d)  ->  out[i] += s[i].sum(dim=-1)"),
            ("in place <-> copy", "6: out[i] += s[i].sum(dim=d)  ->  out[i] = out[i] + s[i].sum(dim=d)"),
            ("in place <-> copy", "7: out.add_(1)  ->  out.add(1)"),
            ("device -> cpu", '4: keep = torch.zeros(n, device=q.device)  ->  keep = torch.zeros(n, device="cpu")')]:
        assert (kind, line) in diffs, (kind, line)
    assert not any("cat_" in line or "zeros_" in line for _, line in diffs)


def test_the_instructors_table_is_made_from_the_recorded_runs(tmp_path):
    """docs/instructors.md's table is the one `--write-docs` makes from autograder/mutation/results/ (a full run
    records itself there), and a record's figures reach it."""
    from autograder.mutation import report
    from autograder.mutation.run import LabResult

    assert report.docs_block(report.records()) in report.DOCS.read_text()
    r = LabResult("07_tensor_parallel", outcome={"ex1_code:1:a": ("check", "ex1_check: AssertionError"),
                                                 "ex1_code:2:b": ("survived", "[off by one] 2: ...")}, seconds=12.0)
    report.record(r, tmp_path)
    docs = tmp_path / "instructors.md"
    docs.write_text(f"before\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.write_docs(tmp_path, docs)
    text = docs.read_text()
    assert "| 07_tensor_parallel | exercises | 2 | 0 | 0 | 1 | 0 | 0 | 0 | 1 | 50.0% | 12 s |" in text
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text


def test_gpu_only_mutants_wait_for_a_gpu(tmp_path):
    """`run_lab(gpu_only=True)` (what `make gpu-check` runs) picks only the mutants known/ lists as GPU-only; without
    a GPU it runs none of them and says how many wait."""
    import json

    import torch

    from autograder.mutation.mutants import mutants_of
    from autograder.mutation.run import notebook_cells, run_lab

    if torch.cuda.is_available():
        pytest.skip("with a GPU these mutants run: make gpu-check")
    cell = next(c for c in notebook_cells("07_tensor_parallel") if c.grade_id == "ex1_code")
    picked = [mu.id for mu in mutants_of(cell.source, cell.grade_id)][:2]
    (tmp_path / "07_tensor_parallel.json").write_text(json.dumps({"gpu_only": {mid: "tf32" for mid in picked}}))
    r = run_lab("07_tensor_parallel", gpu_only=True, known_path=tmp_path, log=lambda *a: None)
    assert r.outcome == {} and r.not_run == {"ex1_code (mutants only a GPU tells apart)": 2}


def test_a_lab_run_in_parts_is_recorded_once_its_parts_cover_every_cell(tmp_path):
    """`--exercise` runs record parts (results/parts/<lab>/); assembled once they cover every exercise cell as it is
    today, they give the record a full run gives, seconds added; a part whose cell changed since does not count."""
    import json

    from autograder.mutation import report
    from autograder.mutation.run import LabResult, notebook_cells

    lab = "07_tensor_parallel"
    cells = [c.grade_id for c in notebook_cells(lab) if c.exercise]
    first, rest = cells[:1], cells[1:]
    r1 = LabResult(lab, outcome={f"{first[0]}:3:a": ("check", "c"), f"{first[0]}:4:b": ("survived", "[x] 4: ..")},
                   equivalent={f"{first[0]}:5:c": "shown"}, not_run={f"{rest[0]}": 9}, mutants=12, seconds=10.0)
    report.record_part(r1, first, tmp_path)
    whole, missing, _ = report.assemble(lab, tmp_path)
    assert whole is None and missing == sorted(rest)
    r2 = LabResult(lab, outcome={f"{rest[0]}:1:d": ("crash", "c"), f"{first[0]}:9:z": ("check", "older run")},
                   not_run={rest[0]: 9}, mutants=11, seconds=5.5)
    report.record_part(r2, rest, tmp_path)
    whole, missing, about = report.assemble(lab, tmp_path)
    assert missing == [] and whole.seconds == 15.5 and whole.mutants == 13
    assert set(whole.outcome) == {f"{first[0]}:3:a", f"{first[0]}:4:b", f"{rest[0]}:1:d"}   # each cell's own part
    assert whole.not_run == {rest[0]: 9} and "in 2 parts" in about["machine"]
    path = report.record(whole, tmp_path, about)
    assert json.loads(path.read_text())["exercises"]["survived"] == 1
    stale = tmp_path / "parts" / lab / f"{'+'.join(sorted(first))}.json"
    part = json.loads(stale.read_text())
    part["cells"][first[0]] = "0" * 12                 # the cell changed since that part ran
    stale.write_text(json.dumps(part))
    assert report.assemble(lab, tmp_path)[1] == first
    with pytest.raises(ValueError, match="no exercise cell"):
        report.record_part(r1, ["ex99_code"], tmp_path)


def test_a_full_run_is_kept_cell_by_cell_so_one_cell_can_be_run_again(tmp_path):
    """record() of a full run also writes one part per exercise cell (seconds: each cell's own, the notebook's run
    with the first); assembled, they give the same record; a cell run again alone replaces its part."""
    import json

    from autograder.mutation import report
    from autograder.mutation.run import LabResult, notebook_cells

    lab = "07_tensor_parallel"
    cells = [c.grade_id for c in notebook_cells(lab) if c.exercise]
    full = LabResult(lab, outcome={f"{cells[0]}:1:a": ("check", "c"), f"{cells[1]}:2:b": ("survived", "[x] 2: ..")},
                     equivalent={f"{cells[1]}:3:c": "shown"}, mutants=3, seconds=100.0,
                     cell_seconds={cells[0]: 30.0, cells[1]: 50.0})
    path = report.record(full, tmp_path)
    assert sorted(p.stem for p in (tmp_path / "parts" / lab).glob("*.json")) == sorted(cells)
    whole, missing, about = report.assemble(lab, tmp_path)
    assert missing == [] and whole.seconds == 100.0 and whole.outcome == full.outcome and whole.mutants == 3
    before = json.loads(path.read_text())
    again = LabResult(lab, outcome={f"{cells[1]}:2:b": ("check", "caught now")},
                      equivalent={f"{cells[1]}:3:c": "shown"}, mutants=2, seconds=45.0)
    report.record_part(again, [cells[1]], tmp_path)
    whole, _, about = report.assemble(lab, tmp_path)
    after = json.loads(report.record(whole, tmp_path, about).read_text())
    assert (before["exercises"]["survived"], after["exercises"]["survived"]) == (1, 0) and whole.seconds == 95.0



def test_cells_run_again_are_cut_out_of_earlier_parts(tmp_path):
    """A run of cells A and B takes them out of earlier parts: the part of A alone goes, a part of B and C keeps C
    (its mutants and a share of its seconds), so no two parts hold one cell (a clone's files share one date)."""
    import json

    from autograder.mutation import report
    from autograder.mutation.run import LabResult, notebook_cells

    lab = "07_tensor_parallel"
    a, b, c = [cell.grade_id for cell in notebook_cells(lab) if cell.exercise][:3]
    report.record_part(LabResult(lab, outcome={f"{a}:1:x": ("check", "")}, mutants=1, seconds=1.0), [a], tmp_path)
    report.record_part(LabResult(lab, outcome={f"{b}:1:y": ("check", ""), f"{c}:1:z": ("survived", "")},
                                 equivalent={f"{c}:2:w": "shown"}, mutants=3, seconds=6.0), [b, c], tmp_path)
    report.record_part(LabResult(lab, outcome={f"{a}:1:x": ("crash", ""), f"{b}:1:y": ("check", "")}, mutants=2,
                                 seconds=2.0), [a, b], tmp_path)
    parts = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "parts" / lab).glob("*.json")}
    assert sorted(parts) == sorted(["+".join(sorted([a, b])), c])
    assert list(parts[c]["cells"]) == [c] and parts[c]["mutants"] == 2 and parts[c]["seconds"] == 4.0
    assert set(parts[c]["outcome"]) == {f"{c}:1:z"} and set(parts[c]["equivalent"]) == {f"{c}:2:w"}
