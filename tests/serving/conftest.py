"""Fixtures for the serving tests (lab 08): tiny seeded models and engines, shared per module or session."""

from __future__ import annotations

import pytest
from serving_fixtures import TINY_SERVING, tiny_model  # noqa: F401  (re-exported for tests written against it)

from minigpt.model import GPT


@pytest.fixture(scope="session")
def tokenizer():
    from minigpt.tokenizer import load_tokenizer
    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny() -> GPT:
    return tiny_model(0)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread, and a busy 2-core machine punishes oversubscription (10x)."""
    from minigpt.timing import fixed_threads
    with fixed_threads(1):
        yield
