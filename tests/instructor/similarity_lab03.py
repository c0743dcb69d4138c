"""Lab 03 answers for the similarity report's tests: the package's reference carried in three ways no earlier report
saw, and an honest answer written independently of it.

* `marshalled_scheduler()`: Exercise 2's `schedule` (and `_admit`, which it calls) as the reference's code objects,
  marshalled, zlib-compressed and base64-encoded into strings, rebuilt with `types.FunctionType` (no source at all);
* `renamed_scheduler()`: the reference's source with its locals renamed and a statement without effect after every
  statement (`pass`, `...`, `None`, `0`, `_ = None`, a docstring-like string);
* `VERBATIM_PACK_CHUNKS`: the reference's `pack_chunks` pasted as it is, for a code cell the learner adds (no nbgrader
  metadata) between Exercise 1's cell and its check;
* `HONEST_PACK_CHUNKS`, `HONEST_SCHEDULER`: Exercise 1 and 2 written from the lab's text alone, in a shape of their
  own (they pass the lab's checks: test_similarity.py shows it).
"""

from __future__ import annotations

import base64
import inspect
import marshal
import re
import textwrap
import zlib

from minigpt.engine.packed_batch import pack_chunks
from minigpt.engine.scheduler import Scheduler

A = "03_continuous_batching"
NB = f"{A}.ipynb"

VERBATIM_PACK_CHUNKS = "from collections.abc import Hashable, Sequence\n\n" + inspect.getsource(pack_chunks)

HONEST_PACK_CHUNKS = '''from minigpt.cache.block_table import block_tables_tensor

def pack_chunks(chunks, manager, device="cpu") -> PackedBatch:
    seq_ids = [c[0] for c in chunks]
    flat_tokens = [int(t) for c in chunks for t in c[1]]
    flat_positions = [c[2] + i for c in chunks for i in range(len(c[1]))]
    flat_slots = [int(s) for c in chunks for s in c[3]]
    sizes = torch.tensor([len(c[1]) for c in chunks])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(sizes, 0)])
    ends = torch.tensor([c[2] + len(c[1]) for c in chunks])
    tables = block_tables_tensor([manager.table(i).blocks for i in seq_ids], device)
    as_row = lambda xs: torch.tensor(xs, device=device).unsqueeze(0)
    return PackedBatch(seq_ids, as_row(flat_tokens), as_row(flat_positions), torch.tensor(flat_slots, device=device),
                       cu.to(device), ends.to(device), tables)
'''

HONEST_SCHEDULER = '''class MyScheduler(Scheduler):
    def schedule(self) -> SchedulerOutput:
        left = self.config.max_num_batched_tokens
        planned, evicted = {}, []
        in_decode = [s for s in self.running if s.num_remaining == 1]
        in_prefill = [s for s in self.running if s.num_remaining != 1]
        for seq in in_decode + in_prefill:
            if not left:
                break
            want = min(seq.num_remaining, left)
            while seq in self.running and self._blocks_for(seq, want) > self.manager.pool.num_free:
                newest = self.running[-1]
                dropped = planned.pop(newest.seq_id, None)
                left += len(dropped.tokens) if dropped else 0
                self._preempt(newest)
                evicted.append(newest)
            if seq in self.running:
                planned[seq.seq_id] = self._reserve(seq, want)
                left -= want
        while not evicted and self.waiting and left and len(self.running) < self.config.max_num_seqs:
            head = self.waiting[0]
            whole = head.num_remaining
            if whole > left and not self.config.enable_chunked_prefill:
                break
            want = min(whole, left)
            if blocks_needed(want, self.manager.block_size) > self.manager.pool.num_free:
                break
            self.waiting.popleft()
            head.status = SequenceStatus.RUNNING
            self.running.append(head)
            planned[head.seq_id] = self._reserve(head, want)
            left -= want
        return SchedulerOutput(list(planned.values()), evicted)
'''

_NO_OPS = ("pass", "...", "None", "0", "_ = None", "'''nothing to see'''")
_RENAMES = {"budget": "room", "chunks": "picked", "preempted": "bumped", "seq": "s", "n": "take", "victim": "last",
            "chunk": "piece", "_admit": "_let_in"}


def renamed_with_no_ops(source: str) -> str:
    """source with _RENAMES applied and one of _NO_OPS after each simple statement (a line that neither opens a
    block nor continues the one before)."""
    for old, new in _RENAMES.items():
        source = re.sub(rf"\b{old}\b", new, source)
    out = ["_ = None"]
    for n, line in enumerate(source.splitlines()):
        out.append(line)
        code = line.split("#")[0].rstrip()
        if code and not code.endswith((":", ",", "(", "[")) and not code.lstrip().startswith(("@", "def ", "class ")):
            indent = line[:len(line) - len(line.lstrip())]
            out.append(indent + _NO_OPS[n % len(_NO_OPS)])
    return "\n".join(out) + "\n"


def renamed_scheduler() -> str:
    """Exercise 2's cell: the reference's schedule() and its admission helper (which the check refuses, so it comes
    along under another name), renamed and padded with statements without effect."""
    methods = [textwrap.indent(textwrap.dedent(inspect.getsource(f)), "    ")
               for f in (Scheduler.schedule, Scheduler._admit)]
    return renamed_with_no_ops("class MyScheduler(Scheduler):\n" + "\n".join(methods))


def _blob(function) -> str:
    blob = base64.b64encode(zlib.compress(marshal.dumps(function.__code__))).decode()
    return "(\n" + "\n".join(f'    "{blob[i:i + 76]}"' for i in range(0, len(blob), 76)) + "\n)"


def marshalled_scheduler() -> str:
    """Exercise 2's cell: the reference's schedule() and _admit() as base64 strings of their zlib-compressed
    marshalled code objects, rebuilt as functions of the notebook."""
    return ("import base64, marshal, types, zlib\n\n"
            f"_SCHEDULE = {_blob(Scheduler.schedule)}\n_ADMIT = {_blob(Scheduler._admit)}\n\n"
            "def _rebuilt(blob):\n"
            "    return types.FunctionType(marshal.loads(zlib.decompress(base64.b64decode(blob))), globals())\n\n"
            "class MyScheduler(Scheduler):\n"
            "    schedule = _rebuilt(_SCHEDULE)\n"
            "    _admit = _rebuilt(_ADMIT)\n")
