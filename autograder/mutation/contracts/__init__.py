"""The exercises' contracts, for the differential tests that show a mutant equivalent (autograder/mutation/
equivalence.py): one module per lab, `labNN.py`, with `CONTRACTS = {grade_id: Contract}`.

An exercise without a contract has no mutant shown equivalent: whatever known/ says, its mutants are graded by the
checks like any other, and a listed-equivalent one that survives counts as a survivor ("not shown").
"""

from __future__ import annotations

import importlib

from autograder.mutation.equivalence import Contract

__all__ = ["contract_for"]


def contract_for(assignment: str, grade_id: str) -> Contract | None:
    """The contract of exercise `grade_id` of lab `assignment` ("04_flash_attention"), or None."""
    try:
        module = importlib.import_module(f"autograder.mutation.contracts.lab{assignment[:2]}")
    except ModuleNotFoundError as err:
        if err.name != f"autograder.mutation.contracts.lab{assignment[:2]}":
            raise
        return None
    return getattr(module, "CONTRACTS", {}).get(grade_id)
