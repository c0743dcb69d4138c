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
