"""Helpers shared by the serving tests (imported by name, like tests/minigpt/minigpt_fixtures.py)."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import torch
from fastapi import FastAPI

from autograder.lab08 import CHECK_CONFIG as TINY_SERVING       # tiny, over the course vocabulary (text prompts work)
from minigpt.config import ModelConfig
from minigpt.model import GPT


def tiny_model(seed: int = 0, config: ModelConfig = TINY_SERVING) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


@contextmanager
def structured_servers(tokenizer: Any, seed: int = 5) -> Iterator[dict[str, tuple[str, FastAPI]]]:
    """backend -> (url, app): one in-thread server per structured-outputs backend, each over its own tiny model."""
    from minigpt.serving.api_server import create_app
    from minigpt.serving.async_engine import AsyncLLMEngine
    from minigpt.serving.engine import EngineConfig, LLMEngine
    from minigpt.serving.launch import serve_in_thread
    from minigpt.serving.structured_outputs import BACKENDS

    with ExitStack() as stack:
        found = {}
        for backend in BACKENDS:
            engine = LLMEngine(tiny_model(seed), EngineConfig(num_blocks=128, block_size=8), tokenizer=tokenizer,
                               model_name="tiny")
            app = create_app(AsyncLLMEngine(engine, num_threads=1), max_queue=8, structured_outputs_backend=backend)
            found[backend] = (stack.enter_context(serve_in_thread(app)), app)
        yield found
