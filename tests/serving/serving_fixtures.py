"""Helpers shared by the serving tests (imported by name, like tests/minigpt/minigpt_fixtures.py)."""

from __future__ import annotations

import torch

from autograder.lab08 import CHECK_CONFIG as TINY_SERVING       # tiny, over the course vocabulary (text prompts work)
from minigpt.config import ModelConfig
from minigpt.model import GPT


def tiny_model(seed: int = 0, config: ModelConfig = TINY_SERVING) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()
