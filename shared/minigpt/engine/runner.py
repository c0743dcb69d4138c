"""One batched model step for mixed work (lab 03): prefill chunks and decodes of many sequences in ONE call.

`ModelRunner.execute(output)` runs the scheduler's chunks on the paged cache and returns the next token
of every sequence whose chunk reached its end (sampled with that sequence's own generator, so each
output is the one it would get alone). A sequence whose request adjusts its logits (penalties, logit_bias, a grammar:
`logits_processing.LogitsProcessor`, carried on the sequence) samples from its adjusted row; logprobs are always
the raw row's. Two layouts of the same step:

* "packed" (default): all tokens in one row (1, N), per-token positions, attention per sequence through
  `packed_batch.varlen_paged_attention`. Rows computed = N = tokens scheduled.
* "padded": lab 02's layout, (B, Tq) with Tq the longest chunk; padding rows are never written or read,
  but they still go through every matmul: rows computed = B * Tq.

`static` (lab 12, `engine.static_step`): decode-only steps run a step whose shapes are fixed per batch-size bucket
(eager or compiled); prefills and mixed steps run as above.

`invariant=True` (packed layout, plain models): every matmul and the attention in a reduction order fixed
independently of the batch (lab 12, `engine.batch_invariant`): each sequence's logits are the same bits
whoever shares its step and however its prefill is chunked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Literal

import torch
from torch import Tensor

from minigpt.cache.block_table import block_tables_tensor
from minigpt.cache.paged import PagedBatch, PagedKVCache
from minigpt.engine.batch_invariant import InvariantModel, invariant_packed_attention
from minigpt.engine.cuda_graph import using_attention
from minigpt.engine.fused_decode import FusedModel, fusable
from minigpt.engine.packed_batch import PackedBatch, pack_chunks, packed_attention, packed_layers
from minigpt.engine.scheduler import ScheduledChunk, SchedulerOutput
from minigpt.engine.static_step import StaticDecodeStep, StaticInputs, decode_only
from minigpt.model import GPT
from minigpt.sampling import sample_next, token_logprobs

__all__ = ["ModelRunner", "PreparedStep", "padded_batch", "rows_computed"]

Layout = Literal["packed", "padded"]


def rows_computed(chunks: list[ScheduledChunk], layout: Layout) -> int:
    """Token rows a step pushes through the weight matmuls: N packed, B * max chunk padded."""
    lens = [len(c.tokens) for c in chunks]
    return sum(lens) if layout == "packed" else len(lens) * max(lens)


def padded_batch(chunks: list[ScheduledChunk], cache: PagedKVCache) -> PagedBatch:
    """The same chunks in lab 02's padded layout (slots already reserved by the scheduler)."""
    B, Tq = len(chunks), max(len(c.tokens) for c in chunks)
    tokens = torch.zeros(B, Tq, dtype=torch.long)
    positions = torch.zeros(B, Tq, dtype=torch.long)
    slots = torch.full((B, Tq), -1, dtype=torch.long)
    for b, c in enumerate(chunks):
        n = len(c.tokens)
        tokens[b, :n] = torch.tensor(c.tokens)
        positions[b] = torch.arange(c.start, c.start + Tq).clamp(max=c.start + n - 1)
        slots[b, :n] = torch.tensor(c.slots)
    ids = [c.seq_id for c in chunks]
    dev = cache.device
    return PagedBatch(ids, tokens.to(dev), positions.to(dev), slots.to(dev),
                      block_tables_tensor([cache.manager.table(s).blocks for s in ids], dev),
                      torch.tensor([c.start + len(c.tokens) for c in chunks], dtype=torch.int32, device=dev),
                      torch.tensor([len(c.tokens) for c in chunks], dtype=torch.int32, device=dev), [0] * B)


@dataclass
class PreparedStep:
    """One step's inputs, made from the scheduler's chunks: the copy-on-write block copies to do first, the batch
    (packed or padded) and the token rows it pushes through the weights."""

    copies: list[tuple[int, int]]
    batch: PackedBatch | PagedBatch | StaticInputs
    rows: int
    host_ops: list[tuple[str, int, int]] = field(default_factory=list)   # host-tier saves and loads, run first


class ModelRunner:
    def __init__(self, model: GPT, cache: PagedKVCache, layout: Layout = "packed", *, fused: bool = False,
                 invariant: bool = False, static: StaticDecodeStep | None = None) -> None:
        """`fused`: run the step on the model's fused, K-major weights (`minigpt.engine.fused_decode`, as the serving
        engine does), where every projection is a plain nn.Linear; the model as written otherwise. `invariant`:
        batch-invariant steps (`engine.batch_invariant`; fused weights, packed layout)."""
        if layout not in ("packed", "padded"):
            raise ValueError(f"layout must be 'packed' or 'padded', got {layout!r}")
        if invariant and (layout != "packed" or not fusable(model)):
            raise ValueError("batch-invariant steps need the packed layout and plain nn.Linear projections "
                             "(not quantized, sharded or adapted weights)")
        if invariant and static is not None:
            raise ValueError("a static decode step is not batch-invariant: choose one")
        self.model, self.cache, self.layout, self.invariant, self.static = model, cache, layout, invariant, static
        self.forward_fn = InvariantModel(model) if invariant else FusedModel(model) if fused and fusable(model) else model
        self.num_forward_calls = 0
        self.num_rows = 0
        self.last_logprobs: dict[Hashable, tuple[float, list[tuple[int, float]]]] = {}

    def prepare(self, chunks: list[ScheduledChunk]) -> PreparedStep:
        """The step's input tensors, read from the block manager (on the thread that schedules: overlap scheduling
        changes the manager while the previous step runs)."""
        copies = [pair for c in chunks for pair in c.copies]
        host_ops = self.cache.take_host_ops()          # decided while scheduling this step; run by it, first
        if self.static is not None and decode_only(chunks) and len(chunks) <= self.static.buckets[-1]:
            inputs = self.static.inputs(chunks)
            return PreparedStep(copies, inputs, len(inputs.tokens), host_ops)
        if self.layout == "packed":
            batch = pack_chunks([(c.seq_id, c.tokens, c.start, c.slots) for c in chunks], self.cache.manager,
                                self.cache.device)
        else:
            batch = padded_batch(chunks, self.cache)
        return PreparedStep(copies, batch, rows_computed(chunks, self.layout), host_ops)

    def refresh_tokens(self, step: PreparedStep, chunks: list[ScheduledChunk]) -> None:
        """Put the chunks' tokens into a step prepared from the same chunks before some of their tokens were known
        (overlap scheduling: a placeholder resolved since)."""
        batch = step.batch
        if isinstance(batch, StaticInputs):
            batch.tokens[:len(chunks)] = torch.tensor([c.tokens[0] for c in chunks])
        elif isinstance(batch, PackedBatch):
            batch.tokens[0] = torch.tensor([t for c in chunks for t in c.tokens])
        else:
            for row, c in enumerate(chunks):
                batch.tokens[row, :len(c.tokens)] = torch.tensor(c.tokens)

    @torch.inference_mode()
    def compute(self, step: PreparedStep) -> Tensor:
        """Logits (B, V) at each chunk's last token, one model call on tensors only (any thread)."""
        self.cache.run_host_ops(step.host_ops)
        self.cache.copy_blocks(step.copies)
        self.num_forward_calls += 1
        self.num_rows += step.rows
        batch = step.batch
        if isinstance(batch, StaticInputs):
            return self.static(batch)
        if self.layout == "packed":
            attention = invariant_packed_attention(batch) if self.invariant else packed_attention(batch)
            layers = packed_layers(self.cache, batch)
            if isinstance(self.forward_fn, FusedModel):            # handed the step's attention, no module swapped
                logits = self.forward_fn(batch.tokens, positions=batch.positions, kv_caches=layers, attention=attention)
            else:
                with using_attention(self.model, attention):
                    logits = self.forward_fn(batch.tokens, positions=batch.positions, kv_caches=layers)
            return logits[0, batch.last_index]
        with using_attention(self.model, self.cache.attention(batch)):
            logits = self.forward_fn(batch.tokens, positions=batch.positions, kv_caches=self.cache.layers(batch))
        return batch.last_logits(logits)

    def forward(self, chunks: list[ScheduledChunk]) -> Tensor:
        """Logits (B, V) at each chunk's last token, one model call."""
        return self.compute(self.prepare(chunks))

    def execute(self, output: SchedulerOutput) -> dict[Hashable, int]:
        """Run the step; sample the next token of every chunk that reached its sequence's end. For a request whose
        SamplingParams ask for `logprobs`, `last_logprobs[seq_id]` = (the token's logprob, the top ones)."""
        self.last_logprobs = {}
        if not output.chunks:
            return {}
        return self.sample(output.chunks, self.forward(output.chunks))

    def sample(self, chunks: list[ScheduledChunk], logits: Tensor, samples: set | None = None) -> dict[Hashable, int]:
        """The next token of each chunk in `samples` (seq ids; default: the chunks that reach their sequence's end),
        from its row of `logits`, with the sequence's own generator and logits processor."""
        self.last_logprobs = {}
        sampled = {}
        for row, c in enumerate(chunks):
            if c.seq_id in samples if samples is not None else c.samples:
                seq = c.seq
                sampling = seq.request.sampling
                processor = seq.logits_processor
                adjusted = logits[row:row + 1] if processor is None else processor(logits[row], seq.output_tokens)[None]
                token = int(sample_next(adjusted, sampling, seq.generator))
                sampled[c.seq_id] = token
                if sampling.logprobs is not None:
                    self.last_logprobs[c.seq_id] = token_logprobs(logits[row], token, sampling.logprobs)
        return sampled
