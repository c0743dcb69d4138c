import pytest
import torch
from minigpt_fixtures import TINY

from minigpt.config import ModelConfig
from minigpt.model import GPT


@pytest.fixture
def tiny_config() -> ModelConfig:
    return TINY


@pytest.fixture
def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(TINY).eval()


@pytest.fixture(scope="session")
def vocab():
    """The course tokenizer's tokens as texts (minigpt.structured), made once for the structured-generation tests."""
    from minigpt.structured.token_masks import Vocabulary
    from minigpt.tokenizer import load_tokenizer

    return Vocabulary.from_tokenizer(load_tokenizer())


@pytest.fixture(scope="session")
def trie(vocab):
    from minigpt.structured.token_masks import TokenTrie

    return TokenTrie(vocab)
