"""The prefill one layer at a time, so each layer's K/V can leave for the decode worker as soon as it exists.

    runner = LayerRunner(model)
    x = runner.embed(prompt)                      # (T, d_model)
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)              # k, v (T, n_kv_heads, head_dim), RoPE applied to k
    first = int(runner.logits(x).argmax())        # logits (V,) of the last position

    first = prefill_and_send(runner, prompt, channel, "req-1")     # layer-wise: send layer i right after it
    first = prefill_then_send(runner, prompt, channel, "req-1")    # whole request: the prefill, then every send

`LayerRunner` runs the model's OWN modules (embedding, each `Block`, final norm and head) on the whole prompt from
position 0, so running embed, every layer and logits gives model(prompt)'s last logits, and layer i's k, v are what
lab 01's `KVCache` holds for layer i after a prefill. It catches k and v with a one-shot layer cache (the model's
`LayerCache` protocol): the block hands its new keys and values to `update`, which keeps and returns them.

Timing (transfer_cost's recurrence): layer-wise, layer l's send starts at max(c_l, end_{l-1}) and only what is left
after the last layer's compute is exposed; whole-request, all of alpha + bytes / B comes after the prefill.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
from torch import Tensor

from minigpt.generate import check_request
from minigpt.model import GPT, rope_angles

__all__ = ["LayerRunner", "KVSender", "prefill_and_send", "prefill_then_send"]


class KVSender(Protocol):
    """What a producer needs from a channel."""

    def send(self, request_id: str, layer: int, k: Tensor, v: Tensor) -> None: ...


class _CatchKV:
    """A one-shot layer cache: keeps the block's new k, v (1, T, Hkv, D) and gives them back unchanged."""

    k: Tensor
    v: Tensor

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k, self.v = k, v
        return k, v


class LayerRunner:
    """The model's prefill as separate steps, over one prompt (no batch dimension)."""

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.n_layers: int = len(model.layers)
        self._angles: dict[int, Tensor] = {}

    @torch.inference_mode()
    def embed(self, prompt: Sequence[int]) -> Tensor:
        """prompt (T token ids) -> x (T, d_model)."""
        ids = check_request(self.model, prompt, 0)
        return self.model.tok_emb(torch.tensor(ids, device=self.model.device))

    @torch.inference_mode()
    def layer(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Block i on x (T, d_model), positions 0..T-1, causal -> (x_next (T, d_model), k, v (T, n_kv_heads,
        head_dim)), RoPE applied to k."""
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers:
            raise ValueError(f"layer index must be an int in [0, {self.n_layers}), got {i!r}")
        if x.ndim != 2 or x.shape[1] != self.model.config.d_model:
            raise ValueError(f"x must be (T, d_model={self.model.config.d_model}), got {tuple(x.shape)}: pass what "
                             "embed() or the previous layer() returned")
        caught = _CatchKV()
        y = self.model.layers[i](x[None], self._rope(x.shape[0]), caught)
        return y[0], caught.k[0], caught.v[0]

    @torch.inference_mode()
    def logits(self, x: Tensor) -> Tensor:
        """x (T, d_model) after the last layer -> logits (V,) of the last position (final norm, then the head)."""
        return self.model.lm_head(self.model.norm(x[-1:]))[0]

    def _rope(self, T: int) -> Tensor:
        if T not in self._angles:
            cfg = self.model.config
            positions = torch.arange(T, device=self.model.device)
            self._angles[T] = rope_angles(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        return self._angles[T]


def prefill_and_send(runner: LayerRunner, prompt: Sequence[int], channel: KVSender, request_id: str) -> int:
    """Layer-wise producer: compute layer i, send its K/V at once, go on; return the first token (greedy)."""
    x = runner.embed(prompt)
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)
        channel.send(request_id, i, k, v)
    return int(runner.logits(x).argmax())


def prefill_then_send(runner: LayerRunner, prompt: Sequence[int], channel: KVSender, request_id: str) -> int:
    """Whole-request producer: compute every layer and the first token (greedy), then send every layer's K/V."""
    x = runner.embed(prompt)
    kv = []
    for i in range(runner.n_layers):
        x, k, v = runner.layer(i, x)
        kv.append((k, v))
    first = int(runner.logits(x).argmax())
    for i, (k, v) in enumerate(kv):
        channel.send(request_id, i, k, v)
    return first
