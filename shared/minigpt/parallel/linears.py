"""Column- and row-parallel linears, plugged into the model through its `make_linear` factory.

A (out, in) weight W, input x (..., in):

    column-parallel:  W split by rows (output features) into W_r (out/tp, in);  y_r = x W_r^T  (..., out/tp)
                      no communication: each rank keeps its slice of the features (its heads).
    row-parallel:     W split by columns (input features) into W_r (out, in/tp); y = sum_r x_r W_r^T
                      each rank has x_r, the slice its column-parallel layer produced, computes a partial
                      sum (..., out), and one all-reduce adds the partial sums: every rank gets the full y.

Attention = column (wq, wk, wv) -> per-head attention, local -> row (wo) -> all-reduce;
MLP       = column (w_gate, w_up) -> silu(.) * (.), elementwise, local -> row (w_down) -> all-reduce.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minigpt.config import ModelConfig
from minigpt.model import LinearFactory
from minigpt.parallel.comm import CountingComm
from minigpt.parallel.sharding import local_linear_shape, parameter_kind

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "tp_linear_factory"]


class ColumnParallelLinear(nn.Module):
    """This rank's output features: y_r = x W_r^T, weight (out_local, in). No collective."""

    def __init__(self, in_features: int, out_local: int, comm: CountingComm) -> None:
        super().__init__()
        self.weight = nn.Parameter(nn.init.normal_(torch.empty(out_local, in_features), std=0.02))
        self.comm = comm

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.t()


class RowParallelLinear(nn.Module):
    """This rank's input features: y = all_reduce(x_r W_r^T), weight (out, in_local)."""

    def __init__(self, in_local: int, out_features: int, comm: CountingComm) -> None:
        super().__init__()
        self.weight = nn.Parameter(nn.init.normal_(torch.empty(out_features, in_local), std=0.02))
        self.comm = comm

    def forward(self, x: Tensor) -> Tensor:
        return self.comm.all_reduce(x @ self.weight.t())


def tp_linear_factory(cfg: ModelConfig, comm: CountingComm, *, column_cls: type = ColumnParallelLinear,
                      row_cls: type = RowParallelLinear) -> LinearFactory:
    """A `make_linear(in, out, name)` that builds rank `comm.rank`'s piece of every projection."""
    tp, rank = comm.world_size, comm.rank

    def make_linear(in_features: int, out_features: int, name: str) -> nn.Module:
        kind = parameter_kind(f"{name}.weight")
        if kind == "replicated":                 # an untied LM head outside vocab parallelism: whole on every rank
            return nn.Linear(in_features, out_features, bias=False)
        in_local, out_local = local_linear_shape(name, in_features, out_features, cfg, tp, rank)
        if kind == "column":
            return column_cls(in_features, out_local, comm)
        return row_cls(in_local, out_features, comm)

    return make_linear
