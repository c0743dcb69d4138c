"""What several labs' checks share: a small model that notices mistakes, a copy of it beside the learner's code, and
a count of Triton launches.

    model = scaled_model(seed=0)                    # SMALL_CONFIG, matrices x6: a wrong position changes the output
    served = model_beside(learner_fn, model)        # the model itself, or a copy in the learner's kernel when judged
    with count_triton_launches() as launches:       # launches[0]: how many; launches.kernels: which kernels
        fn(x)

Labs are siblings: a lab's checks import from here, never from another lab.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from autograder.checking.wire import is_remote, run_where
from minigpt.config import ModelConfig
from minigpt.model import GPT

__all__ = ["SMALL_CONFIG", "NEAR_TIE", "scaled_model", "model_beside", "Launches", "count_triton_launches",
           "LetterTokenizer"]

SMALL_CONFIG = ModelConfig(vocab_size=256, max_seq_len=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
NEAR_TIE = 1e-3          # top-2 logit gap below which batched float sums may flip the greedy choice


# ----------------------------------------------------------------------------- small models

def scaled_model(seed: int = 0, config: ModelConfig = SMALL_CONFIG, scale: float = 6.0) -> GPT:
    """A small random model whose matrices are scaled (x6 by default): at the usual init a random model repeats its
    last token whatever the context, so a wrong position or an attended padding token would go unnoticed."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(scale)
    return model


def model_beside(side: Any, model: GPT) -> GPT:
    """`model` itself, or when `side` (the learner's function or class) is a Remote, a copy of it built in the learner's
    kernel from its weights (sent as data): the package's generation code needs a real GPT, and a model left in the
    judge would make each of its forward calls a round trip."""
    if not is_remote(side):
        return model
    return run_where(side, _model_from_weights, model.config, model.state_dict())


def _model_from_weights(config: ModelConfig, weights: dict[str, torch.Tensor]) -> GPT:
    with torch.random.fork_rng(devices=[]):       # the initial weights are overwritten: leave the learner's RNG alone
        model = GPT(config).eval()
    model.load_state_dict(weights)
    return model


# ----------------------------------------------------------------------------- Triton launches

class Launches(list):
    """[number of Triton launches]; `.kernels`: the Python function of each kernel launched."""

    def __init__(self) -> None:
        super().__init__([0])
        self.kernels: list[Callable] = []


@contextlib.contextmanager
def count_triton_launches() -> Iterator[Launches]:
    """Count Triton kernel launches (compiled or interpreted) inside the block: yields a one-item list, whose
    `.kernels` names the kernels launched."""
    import minigpt.kernels  # noqa: F401  (Triton deferred; on a CPU: TRITON_INTERPRET=1 before any kernel is built)
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    counter = Launches()
    originals = {cls: cls.run for cls in (InterpretedFunction, JITFunction)}

    def wrap(original):
        def run(self, *args, **kwargs):
            counter[0] += 1
            if getattr(self, "fn", None) is not None and self.fn not in counter.kernels:
                counter.kernels.append(self.fn)
            return original(self, *args, **kwargs)
        return run

    try:
        for cls, original in originals.items():
            cls.run = wrap(original)
        yield counter
    finally:
        for cls, original in originals.items():
            cls.run = original


class LetterTokenizer:
    """decode(ids) -> one letter per token: enough for stop strings on the small models' vocabularies (labs 01 and
    06; judged, build it where the learner's generator runs: run_where(generate_fn, LetterTokenizer))."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)
