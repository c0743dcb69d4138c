"""GPU tier: the decode step replayed from a CUDA graph (behind autograder.harness.require_gpu)."""

from __future__ import annotations

from typing import Callable

import torch

from autograder.harness import assert_finite, check_speedup, quiet, within
from autograder.lab01.common import GRAPH_SPEED_CHECK, random_prompt
from autograder.checking.wire import in_kernel
from minigpt.cache.contiguous import KVCache
from minigpt.config import TARGET_CONFIG
from minigpt.engine.cuda_graph import GraphedDecodeStep
from minigpt.model import GPT


# In the kernel (autograder.checking.wire.in_kernel), not judged: the learner's step captures a CUDA graph of the model's
# forward and writes the cache in place on the device, so the model and the cache must live in the process that
# captures and replays it (a judge-side model would be a round trip per forward, which a capture cannot record),
# and the graphed and eager steps are timed with CUDA events of that one process.
@in_kernel
def check_graphed_decode(make_step: Callable, *, prompt_len: int = 32, steps: int = 64) -> dict[str, float]:
    """make_step(model, cache) -> step(tokens (1, 1), position) -> logits (1, V) on a GPU: logits match the eager
    cached decode step, and `steps` graphed steps beat `steps` eager ones by the calibrated fraction
    (GRAPH_SPEED_CHECK) of the reference (minigpt.engine.cuda_graph.GraphedDecodeStep)."""
    if not torch.cuda.is_available():
        raise AssertionError("check_graphed_decode needs a CUDA GPU; gate it with autograder.harness.require_gpu")
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = GPT(TARGET_CONFIG).to(device).eval()
    prompt = torch.tensor([random_prompt(prompt_len, TARGET_CONFIG.vocab_size, seed=4)], device=device)
    size = prompt_len + steps + 1

    @torch.inference_mode()
    def prefilled() -> KVCache:
        cache = KVCache.for_model(model, 1, max_seq_len=size)
        model(prompt, positions=cache.next_positions(prompt_len), kv_caches=cache)
        return cache

    with quiet(), torch.inference_mode():
        learner_cache, eager_cache, ref_cache = prefilled(), prefilled(), prefilled()
        try:
            step = make_step(model, learner_cache)
        except NotImplementedError:
            raise AssertionError("make_graphed_decode_step is not implemented yet (NotImplementedError)") from None
        except Exception as err:
            raise AssertionError(f"make_step(model, cache) raised {type(err).__name__}: {err}") from None
        reference = GraphedDecodeStep(model, ref_cache)
        token = prompt[:, -1:].clone()
        for i in range(8):
            position = prompt_len + i
            want = model(token, positions=eager_cache.next_positions(1), kv_caches=eager_cache)[:, -1].float()
            got = step(token, position)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                raise AssertionError(f"decode step {i}: expected logits of shape {tuple(want.shape)}, got "
                                     f"{getattr(got, 'shape', type(got).__name__)}")
            assert_finite(got, f"make_graphed_decode_step: decode step {i} (position {position}): the graphed logits",
                          want)
            err = (got.float() - want).abs().max().item()
            if not within(err, 1e-3):
                raise AssertionError(f"decode step {i} (position {position}): graphed logits differ from the eager cached "
                                     f"step by up to {err:.3g}. Copy new inputs INTO the static buffers (copy_, fill_) "
                                     "before replay(), and make the captured step read/write the cache at the position "
                                     "held in a device tensor.")
            token = want.argmax(-1, keepdim=True)

        def run(decode: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[], None]:
            def go() -> None:
                for i in range(steps):
                    decode(token, prompt_len + i)
            return go

        def eager(tok: torch.Tensor, position: int) -> torch.Tensor:
            for layer in eager_cache:
                layer.length = position
            return model(tok, positions=eager_cache.next_positions(1), kv_caches=eager_cache)[:, -1]

        return check_speedup(run(step), run(eager), run(reference),
                             what=f"{steps} decode steps replayed from a CUDA graph vs eager",
                             check=GRAPH_SPEED_CHECK, repeats=5, warmup=1, device="cuda")
