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
    raise NotImplementedError(f"runtime: no torch form for library op {n.op!r}")


def run_library(n: Node, args: list[torch.Tensor], out: torch.Tensor) -> None:
    """Compute library node ``n`` on ``args`` into ``out``."""
    library_fn(n, out)(*args)
