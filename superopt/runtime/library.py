"""Kernel-level library ops as torch calls that write into preallocated buffers (``out=``).

Views (reshape, transpose, slice) allocate no device memory; every other op writes into the
buffer the runtime's pool gives it, so a compiled graph allocates nothing per call.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from ..ir import Node, op_info
from ..ir.ops import Category

_UNARY = {
    "exp": torch.exp, "neg": torch.neg, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    # ---- activations (issue 27, search-ops)
    "erf": torch.erf, "relu": torch.relu,
}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum}


def view(n: Node, x: torch.Tensor) -> torch.Tensor:
    if n.op == "transpose":
        return x.transpose(-1, -2)
    if n.op == "reshape":
        return x.reshape(n.attr("shape"))
    if n.op == "slice":
        return x.narrow(n.attr("dim"), n.attr("start"), n.attr("stop") - n.attr("start"))
    raise ValueError(f"{n.op} is not a view")


def library_fn(n: Node, out: torch.Tensor) -> Callable[..., None]:
    """``fn(*args)`` computes library node ``n`` into ``out``: the op is resolved once, not per call."""
    cat = op_info(n.op).category
    if cat is Category.UNARY:
        if n.op == "square":
            return lambda x: torch.mul(x, x, out=out)
        if n.op == "silu":
            return lambda x: torch.ops.aten.silu.out(x, out=out)
        if n.op == "gelu_tanh":
            return lambda x: torch.ops.aten.gelu.out(x, approximate="tanh", out=out)
        if n.op == "gelu":
            return lambda x: torch.ops.aten.gelu.out(x, out=out)
        return functools.partial(_UNARY[n.op], out=out)
    if cat is Category.BINARY:
        return functools.partial(_BINARY[n.op], out=out)
    if n.op in ("reduce_sum", "reduce_max"):
        reduce, dim, keep = (torch.sum if n.op == "reduce_sum" else torch.amax), n.attr("dim"), bool(n.attr("keepdim"))
        return lambda x: reduce(x, dim, keep, out=out)
    if n.op == "matmul":
        return functools.partial(torch.matmul, out=out)
    if n.op == "cast":
        return out.copy_
    if n.op == "concat":
        dim = n.attr("dim")
        return lambda *xs: torch.cat(xs, dim, out=out)
    if n.op in MOVEMENT:  # ---- data movement (ir/movement.py) ----
        return _movement_fn(n, out)
    raise NotImplementedError(f"runtime: no torch form for library op {n.op!r}")


MOVEMENT = frozenset({"permute", "repeat", "gather", "scatter"})


def _movement_fn(n: Node, out: torch.Tensor) -> Callable[..., None]:
    """Data-movement ops into ``out`` without a temporary (a decode step allocates nothing)."""
    if n.op == "permute":
        perm = n.attr("perm")
        return lambda x: out.copy_(x.permute(*perm))
    if n.op == "repeat":
        d, times = n.attr("dim"), n.attr("times")
        grouped = out.shape[:d] + (out.shape[d] // times, times) + out.shape[d + 1:]
        return lambda x: out.view(grouped).copy_(x.unsqueeze(d + 1).expand(grouped))
    dim = n.attr("dim")
    if n.op == "gather":
        return lambda x, idx: torch.index_select(x, dim, idx, out=out)

    def scatter(x, idx, src):  # the functional cache write: the whole cache is copied first
        out.copy_(x)
        out.index_copy_(dim, idx, src)
    return scatter


def scatter_in_place(n: Node) -> Callable[..., None]:
    """Scatter node ``n`` written into its base itself (``CompiledGraph``'s ``in_place`` inputs: a
    decode step's cache write touches one slot, not a copy of the whole cache)."""
    dim = n.attr("dim")
    return lambda x, idx, src: x.index_copy_(dim, idx, src)


def run_library(n: Node, args: list[torch.Tensor], out: torch.Tensor) -> None:
    """Compute library node ``n`` on ``args`` into ``out``."""
    library_fn(n, out)(*args)
