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


@pytest.fixture(scope="session")
def tiny_course_lm() -> GPT:
    """A seeded random model on the course tokenizer's 4,096 tokens, for loops that mask the vocabulary (its own
    generator: the global RNG untouched)."""
    config = ModelConfig(vocab_size=4096, max_seq_len=96, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    with torch.random.fork_rng():                    # GPT's own init draws from the global RNG: restored after
        model = GPT(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's engine tests (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`):
    tiny models run fastest so, and a busy 2-core machine punishes oversubscription."""
    from minigpt.timing import fixed_threads

    with fixed_threads(1):
        yield
