"""The ways a notebook can patch its own grading from inside the kernel (issue 20), as cells to insert.

Each is a code cell a learner could add to a submission. When test cells ran in the learner's kernel, each won
points for unanswered exercises; with test cells run by the judge (autograder/judging/judge.py) none of them earns
anything. The four in ATTACKS leave the notebook's other cells as they were (so the graded notebook still
shows where Run All would stop); SILENCE_EVERYTHING turns every later cell into `pass`, the judge's serving
cells included.
"""

from __future__ import annotations

import nbformat

NO_OP_CHECKS = '''\
import importlib, pkgutil, autograder
for info in pkgutil.iter_modules(autograder.__path__, 'autograder.'):
    if info.name.startswith('autograder.lab'):
        module = importlib.import_module(info.name)
        for name in dir(module):
            if name.startswith('check_'):
                setattr(module, name, lambda *args, **kwargs: {})
'''

FAKE_MODULES = '''\
import importlib, sys, types
class _Passing(types.ModuleType):
    """The real check module, except that every check passes."""
    def __init__(self, real):
        super().__init__(real.__name__)
        self._real = real
    def __getattr__(self, name):
        return (lambda *args, **kwargs: {}) if name.startswith('check_') else getattr(self._real, name)
for lab in range(10):
    name = f'autograder.lab{lab:02d}'
    sys.modules[name] = _Passing(importlib.import_module(name))
'''

INPUT_TRANSFORMER = '''\
import re
def _skip_tests(lines):
    return ['pass\\n'] if re.search(r'(?<![\\w.])check_\\w+\\(|lab\\d\\d\\.check_', ''.join(lines)) else lines
get_ipython().input_transformers_cleanup.append(_skip_tests)
'''

PATCHED_HARNESS = '''\
import autograder.harness as _h
_h.check_answer = lambda *args, **kwargs: None
'''

SILENCE_EVERYTHING = '''\
get_ipython().input_transformers_cleanup.append(lambda lines: ['pass\\n'])
'''

ATTACKS = {"no-op checks": NO_OP_CHECKS, "fake check modules": FAKE_MODULES,
           "input transformer": INPUT_TRANSFORMER, "patched harness": PATCHED_HARNESS}


# Answers that are not the work (issue 32): one-line wrappers around the package's reference, and an output of NaN
# where a check compares with a tolerance. Put in the released notebook's answer cells, they must earn nothing.
_WRAP = "import minigpt.longctx.{module} as _ref\ndef {name}(*args, **kwargs):\n    return _ref.{name}(*args, **kwargs)\n"
CHEATS = {
    "09_long_context": {
        "ex1_code": _WRAP.format(module="rope_scaling", name="scaled_inv_freq"),
        "ex4_code": _WRAP.format(module="kv_compression", name="kv_bytes_per_token"),
        "ex5_code": _WRAP.format(module="mla", name="absorbed_decode"),
        "ex6_code": _WRAP.format(module="eviction", name="snapkv_keep"),
        "ex7_code": "def ring_attention(comm, q, k, v):\n    return torch.full_like(q, float('nan'))\n",
        "ex8_code": _WRAP.format(module="ring_attention", name="ring_bytes_per_rank"),
    },
    "11_disaggregation_moe": {
        "ex1_code": "from minigpt.disagg import transfer_cost as _ref_ends\nlayer_send_ends = lambda c, s: _ref_ends.layer_send_ends(c, s)\n",
        "ex2_code": "from minigpt.disagg import layerwise as _ref_send\n"
                    "def prefill_and_send(runner, prompt, channel, request_id):\n"
                    "    return _ref_send.prefill_and_send(runner, prompt, channel, request_id)\n",
        "ex3_code": "from minigpt.disagg import receiver as _ref_recv\n"
                    "def receive_kv(channel, request_id, n_layers, n_tokens, store):\n"
                    "    return _ref_recv.receive_kv(channel, request_id, n_layers, n_tokens, store)\n",
        "ex4_code": "from minigpt.moe import expert_parallel as _ref_moe\n"
                    "def moe_forward(x, probabilities, experts, top_k):\n"
                    "    return _ref_moe.moe_forward(x, probabilities, experts, top_k)\n",
        "ex5_code": "from minigpt.moe import ep_exchange as _ref_ep\nep_dispatch = lambda *a: _ref_ep.ep_dispatch(*a)\n"
                    "ep_combine = lambda *a: _ref_ep.ep_combine(*a)\n",
        "ex6_code": "from minigpt.moe import eplb as _ref_eplb\neplb_placement = lambda *a: _ref_eplb.eplb_placement(*a)\n",
    },
    "10_structured_generation": {
        "ex1_code": "import minigpt.structured.token_masks as _ref\nmask_by_scan = lambda *a: _ref.mask_by_scan(*a)\n",
        "ex2_code": "import minigpt.structured.token_masks as _ref\n"
                    "def mask_by_trie(dfa, state, trie):\n    return _ref.mask_by_scan(dfa, state, trie.vocab)\n",
        "ex3_code": "import minigpt.structured.json_schema as _ref\n"
                    "def object_rules(name, members):\n    return _ref.object_rules(name, [tuple(m) for m in members])\n",
        "ex4_code": "from minigpt.structured.constrained import generate_constrained as _ref\n"
                    "def generate_json(model, prompt, schema, n):\n"
                    "    return _ref(model, prompt, compile_json_schema(schema), trie, max_new_tokens=n).tokens\n",
    },
}


def with_attacks(notebook_path, dest, attacks=tuple(ATTACKS), extra: dict[str, str] | None = None,
                 answers: dict[str, str] | None = None) -> None:
    """Copy a notebook, adding the chosen attacks as plain code cells before its first cell; `answers` replaces
    the source of answer cells by grade_id (CHEATS[lab])."""
    sources = {**ATTACKS, **(extra or {})}
    nb = nbformat.read(str(notebook_path), as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in (answers or {}):
            cell.source = answers[grade_id]
    nb.cells = [nbformat.v4.new_code_cell(sources[a]) for a in attacks] + nb.cells
    nbformat.write(nb, str(dest))
