"""Many LoRA adapters on one base model (lab 08): stacked low-rank factors and the batched LoRA matmul.

A LoRA adapter changes each projection W (d_out, d_in) by a low-rank product:

    W_a = W + s * B_a @ A_a          A_a (r, d_in), B_a (d_out, r), s = alpha / r

Serving many adapters on one base (Punica, S-LoRA, vLLM's multi-LoRA) never merges them. The base
weight is shared by every request, and each token row adds its own adapter's delta:

    y_i = W x_i + s * B_{a_i} (A_{a_i} x_i)                     a_i = adapter of row i, -1 = none

The adapters of one projection are stored STACKED, A (n_adapters, r, d_in) and B (n_adapters, d_out, r),
so a mixed batch gathers each row's factors by index and applies them in two batched matmuls
(`lora_delta`, the BGMV kernel of Punica): one model step serves requests of different adapters.

    adapters = LoRAAdapters.random(model, ["sql", "poem", "chat", "terse"], rank=8, seed=0)
    lora_model = with_lora(model, adapters)             # a copy of model, projections wrapped
    with using_adapters(lora_model, torch.tensor([0, 2, -1])):    # one adapter index per sequence
        logits = lora_model(tokens)                       # tokens (3, T)
    merged = merge_adapter(model, adapters, 2)            # W + s * B_2 A_2: the reference for row 1

The course has no trained adapter: `LoRAAdapters.random` draws seeded random factors (B not zero, unlike
training's init) whose delta is a set fraction of each weight's size, so outputs change measurably.
Adapters are saved and loaded with safetensors.
"""

from __future__ import annotations

import copy
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from minigpt.model import GPT
from minigpt.quant.linear import projection_names, quantize_linears

__all__ = ["lora_delta", "LoRADeltaFn", "LoRAAdapters", "LoRALinear", "AdapterSelection", "with_lora",
           "using_adapters", "set_delta_fn", "merge_adapter", "PROJECTIONS"]

LoRADeltaFn = Callable[[Tensor, Tensor, Tensor, Tensor, float], Tensor]
PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def lora_delta(x: Tensor, A: Tensor, B: Tensor, adapter_idx: Tensor, scaling: float) -> Tensor:
    """The batched LoRA matmul (Punica's BGMV): row i gets s * B[a_i] @ A[a_i] @ x_i, or 0 where a_i = -1.

    x (N, d_in); A (n_adapters, r, d_in); B (n_adapters, d_out, r); adapter_idx (N,) int64 in
    [-1, n_adapters); returns (N, d_out) in x's dtype. Gathering the factors per row makes it two
    batched matmuls for any mix of adapters: no loop over rows, and -1 is masked, never used as an
    index (A[-1] would be the LAST adapter). In PyTorch the gather A[idx] copies the factors once per
    row, (N, r, d_in) + (N, d_out, r) numbers; Punica's BGMV kernel reads them in place instead
    (`lora_bench.lora_delta_grouped` is the per-adapter, SGMV-like alternative).
    """
    has_adapter = adapter_idx >= 0
    idx = adapter_idx.clamp(min=0)
    shrink = torch.bmm(A[idx], x.unsqueeze(-1).to(A.dtype))        # (N, r, 1):     A_a x
    expand = torch.bmm(B[idx], shrink).squeeze(-1)                 # (N, d_out):    B_a (A_a x)
    return (expand * (scaling * has_adapter)[:, None]).to(x.dtype)


@dataclass
class LoRAAdapters:
    """n adapters for one base model: per projection name ("layers.0.attn.wq", ...) the stacked factors
    A (n, r, d_in) and B (n, d_out, r); delta of adapter a = alpha / r * B[a] @ A[a]."""

    names: list[str]
    rank: int
    alpha: float
    factors: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"adapter names must be distinct and at least one, got {self.names!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be an int >= 1, got {self.rank!r}")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"LoRA alpha must be a positive number, got {self.alpha!r}")
        n = len(self.names)
        for proj, (A, B) in self.factors.items():
            if A.ndim != 3 or B.ndim != 3 or A.shape[:2] != (n, self.rank) or B.shape[0] != n or B.shape[2] != self.rank:
                raise ValueError(f"{proj}: A {tuple(A.shape)} and B {tuple(B.shape)} should be ({n}, {self.rank}, d_in) "
                                 f"and ({n}, d_out, {self.rank}) for {n} adapters of rank {self.rank}")

    @property
    def scaling(self) -> float:
        """s = alpha / r: the usual LoRA convention, so changing r keeps the delta's size."""
        return self.alpha / self.rank

    def __len__(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        """The stacked index of adapter `name` (a ValueError naming the known adapters otherwise)."""
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"unknown adapter {name!r}; known adapters: {self.names}") from None

    def delta_weight(self, projection: str, adapter: int) -> Tensor:
        """s * B[a] @ A[a], (d_out, d_in): what merging adapter a adds to that projection's weight."""
        A, B = self.factors[projection]
        return self.scaling * (B[adapter].double() @ A[adapter].double()).float()

    def num_parameters(self) -> int:
        """Parameters of ONE adapter: sum over projections of r * (d_in + d_out)."""
        return sum(A.shape[1] * A.shape[2] + B.shape[1] * B.shape[2] for A, B in self.factors.values())

    def nbytes_per_adapter(self, bytes_per_element: int | None = None) -> int:
        """Bytes of one adapter's factors (in their own dtype unless `bytes_per_element` is given)."""
        if bytes_per_element is None:
            bytes_per_element = next(iter(self.factors.values()))[0].element_size()
        return self.num_parameters() * bytes_per_element

    @classmethod
    def random(cls, model: GPT, names: Sequence[str] | int, rank: int = 8, alpha: float | None = None, *,
               seed: int = 0, strength: float = 0.5, projections: Sequence[str] = PROJECTIONS,
               dtype: torch.dtype = torch.float32) -> "LoRAAdapters":
        """Seeded random adapters for `model` (no trained adapter exists for the course model).

        A ~ N(0, 1/d_in) per entry; B drawn so that the delta s * B A has entries of standard deviation
        `strength` times the RMS of the base weight W: big enough to change greedy outputs, small enough
        to keep the text text-like. `names` may be a count (adapter-0, adapter-1, ...).
        """
        names = [f"adapter-{i}" for i in range(names)] if isinstance(names, int) else list(names)
        alpha = float(2 * rank if alpha is None else alpha)
        g = torch.Generator().manual_seed(seed)
        factors = {}
        n = len(names)
        for proj in projection_names(model):
            if proj.rsplit(".", 1)[-1] not in projections:
                continue
            W = _weight_of(model.get_submodule(proj))
            d_out, d_in = W.shape
            rms = W.float().pow(2).mean().sqrt().item()
            A = torch.randn(n, rank, d_in, generator=g) / math.sqrt(d_in)
            # entry of s*B@A: s * sqrt(r) * std_B * std_A = strength * rms  ->  std_B as below
            std_b = strength * rms * math.sqrt(d_in) / ((alpha / rank) * math.sqrt(rank))
            B = torch.randn(n, d_out, rank, generator=g) * std_b
            factors[proj] = (A.to(dtype), B.to(dtype))
        return cls(names, rank, alpha, factors)

    def save(self, path: str | Path) -> Path:
        """One safetensors file: "<projection>.lora_A" / ".lora_B" stacked tensors; names, rank, alpha in metadata."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for proj, (A, B) in self.factors.items():
            tensors[f"{proj}.lora_A"], tensors[f"{proj}.lora_B"] = A.contiguous(), B.contiguous()
        save_file(tensors, str(path), metadata={"names": json.dumps(self.names), "rank": str(self.rank),
                                                 "alpha": repr(self.alpha), "format": "minigpt-lora-stacked-v1"})
        return path

    @classmethod
    def load(cls, path: str | Path, model: GPT | None = None) -> "LoRAAdapters":
        """Read a file written by `save`; with `model`, check every projection exists and its shape fits."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no LoRA adapter file at {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except Exception as err:
            raise ValueError(f"{path} is not a readable safetensors file ({err})") from None
        if meta.get("format") != "minigpt-lora-stacked-v1":
            raise ValueError(f"{path} is not a stacked LoRA file written by LoRAAdapters.save (metadata {meta})")
        tensors = load_file(str(path))
        projs = sorted({k.rsplit(".", 1)[0] for k in tensors})
        factors = {p: (tensors[f"{p}.lora_A"], tensors[f"{p}.lora_B"]) for p in projs}
        adapters = cls(json.loads(meta["names"]), int(meta["rank"]), float(meta["alpha"]), factors)
        if model is not None:
            known = set(projection_names(model))
            for p, (A, B) in factors.items():
                if p not in known:
                    raise ValueError(f"{path}: projection {p!r} is not in the model (its projections: {sorted(known)[:3]}...)")
                W = _weight_of(model.get_submodule(p))
                if (B.shape[1], A.shape[2]) != tuple(W.shape):
                    raise ValueError(f"{path}: {p} adapters are for a ({B.shape[1]}, {A.shape[2]}) weight, the model's is "
                                     f"{tuple(W.shape)}")
        return adapters


def _weight_of(module: nn.Module) -> Tensor:
    """The float weight (d_out, d_in) of a projection: nn.Linear, a quantized linear, or a LoRALinear's base."""
    if isinstance(module, LoRALinear):
        module = module.base
    if hasattr(module, "dequantized_weight"):
        return module.dequantized_weight()
    if isinstance(getattr(module, "weight", None), Tensor):
        return module.weight.detach()
    raise TypeError(f"cannot read a weight from {type(module).__name__}")


class AdapterSelection:
    """What every LoRALinear of one model reads during a forward: the adapter index of each row, and the
    batched-matmul function. indices None = no adapter at all (the base model's cost exactly)."""

    def __init__(self, num_adapters: int, delta_fn: LoRADeltaFn = lora_delta) -> None:
        self.num_adapters = num_adapters
        self.indices: Tensor | None = None
        self.delta_fn = delta_fn


class LoRALinear(nn.Module):
    """y = base(x) + delta_fn(x rows, A, B, adapter index of each row, s).

    x (..., d_in). The selection's indices are either one per token row, shaped like x[..., 0], or one
    per sequence, shape (B,) for x (B, T, d_in), broadcast over the sequence's T tokens.
    """

    def __init__(self, base: nn.Module, A: Tensor, B: Tensor, scaling: float, selection: AdapterSelection) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("lora_A", A)
        self.register_buffer("lora_B", B)
        self.scaling = float(scaling)
        self.selection = selection

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        idx = self.selection.indices
        if idx is None:
            return y
        lead = x.shape[:-1]
        if idx.shape != lead:
            if idx.ndim != 1 or len(lead) < 2 or idx.shape[0] != lead[0]:
                raise ValueError(f"adapter indices {tuple(idx.shape)} fit neither the rows {tuple(lead)} nor the "
                                 f"batch ({lead[0]},)")
            idx = idx.view(-1, *([1] * (len(lead) - 1))).expand(lead)
        rows = x.reshape(-1, x.shape[-1])
        delta = self.selection.delta_fn(rows, self.lora_A, self.lora_B, idx.reshape(-1), self.scaling)
        return y + delta.view(*lead, -1).to(y.dtype)

    def extra_repr(self) -> str:
        n, r, d_in = self.lora_A.shape
        return f"adapters={n}, rank={r}, d_in={d_in}, d_out={self.lora_B.shape[1]}, scaling={self.scaling:g}"


def with_lora(model: GPT, adapters: LoRAAdapters, *, delta_fn: LoRADeltaFn = lora_delta,
              inplace: bool = False) -> GPT:
    """A copy of `model` (or `model` itself with inplace=True) whose projections carry the adapters.

    Each projection named in `adapters.factors` becomes LoRALinear(the original module, A, B, s), so a
    quantized base works too. All of them share one AdapterSelection, at `model.lora_selection`.
    """
    target = model if inplace else copy.deepcopy(model)
    known = set(projection_names(target))
    missing = [p for p in adapters.factors if p not in known]
    if missing:
        raise ValueError(f"adapters name projections the model does not have: {missing[:3]}")
    selection = AdapterSelection(len(adapters), delta_fn)
    for proj, (A, B) in adapters.factors.items():
        module = target.get_submodule(proj)
        if isinstance(module, LoRALinear):
            raise ValueError(f"{proj} already carries LoRA adapters")
        d_out, d_in = _weight_of(module).shape
        if (B.shape[1], A.shape[2]) != (d_out, d_in):
            raise ValueError(f"{proj}: adapters for a ({B.shape[1]}, {A.shape[2]}) weight, the model's is ({d_out}, {d_in})")
        parent_name, attr = proj.rsplit(".", 1)
        dev = _weight_of(module).device
        setattr(target.get_submodule(parent_name), attr,
                LoRALinear(module, A.to(dev), B.to(dev), adapters.scaling, selection))
    target.lora_selection = selection
    return target


def _selection(model: GPT) -> AdapterSelection:
    sel = getattr(model, "lora_selection", None)
    if not isinstance(sel, AdapterSelection):
        raise ValueError("this model carries no LoRA adapters; build it with minigpt.serving.lora.with_lora")
    return sel


@contextmanager
def using_adapters(model: GPT, indices: Tensor | Sequence[int] | None) -> Iterator[None]:
    """Set the adapter index of every sequence (B,) or every token row for the block; -1 = base model."""
    sel = _selection(model)
    if indices is not None and not isinstance(indices, Tensor):
        indices = torch.tensor(list(indices), dtype=torch.long)
    if indices is not None:
        n = sel.num_adapters
        if indices.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"adapter indices must be an integer tensor, got {indices.dtype}")
        # values are checked on the host only (reading a GPU tensor back would sync every step)
        if indices.device.type == "cpu" and indices.numel() and (int(indices.min()) < -1 or int(indices.max()) >= n):
            raise ValueError(f"adapter indices must be in [-1, {n}) (-1 = no adapter), got {indices.tolist()}")
        indices = indices.long().to(model.device)
    before = sel.indices
    sel.indices = indices
    try:
        yield
    finally:
        sel.indices = before


def set_delta_fn(model: GPT, delta_fn: LoRADeltaFn) -> None:
    """Swap the batched LoRA matmul of every LoRALinear in `model` (e.g. the learner's own)."""
    _selection(model).delta_fn = delta_fn


def merge_adapter(model: GPT, adapters: LoRAAdapters, adapter: int | str) -> GPT:
    """A new plain GPT with adapter `adapter` merged: W + s * B_a A_a in every projection it touches.

    The slow, single-adapter way of serving a fine-tune, and the reference the batched path must equal.
    """
    a = adapters.index(adapter) if isinstance(adapter, str) else int(adapter)
    if not 0 <= a < len(adapters):
        raise ValueError(f"adapter index {a} is outside [0, {len(adapters)})")

    def make(name: str, weight: Tensor) -> nn.Module:
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        merged = weight.float() + adapters.delta_weight(name, a).to(weight.device) if name in adapters.factors \
            else weight
        with torch.no_grad():
            linear.weight.copy_(merged.to(weight.dtype))
        return linear

    return quantize_linears(model, make)

