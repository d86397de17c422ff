"""Kernel-level library ops as torch calls that write into preallocated buffers (``out=``).

Views (reshape, transpose, slice) allocate no device memory; every other op writes into the
buffer the runtime's pool gives it, so a compiled graph allocates nothing per call.
"""
from __future__ import annotations

import torch

from ..ir import Node, op_info
from ..ir.ops import Category

_UNARY = {
    "exp": torch.exp, "neg": torch.neg, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh,
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


def run_library(n: Node, args: list[torch.Tensor], out: torch.Tensor) -> None:
    """Compute library node ``n`` on ``args`` into ``out``."""
    cat = op_info(n.op).category
    if cat is Category.UNARY:
        (x,) = args
        if n.op == "square":
            torch.mul(x, x, out=out)
        elif n.op == "silu":
            torch.ops.aten.silu.out(x, out=out)
        elif n.op == "gelu_tanh":
            torch.ops.aten.gelu.out(x, approximate="tanh", out=out)
        else:
            _UNARY[n.op](x, out=out)
    elif cat is Category.BINARY:
        _BINARY[n.op](args[0], args[1], out=out)
    elif n.op == "reduce_sum":
        torch.sum(args[0], n.attr("dim"), bool(n.attr("keepdim")), out=out)
    elif n.op == "reduce_max":
        torch.amax(args[0], n.attr("dim"), bool(n.attr("keepdim")), out=out)
    elif n.op == "matmul":
        torch.matmul(args[0], args[1], out=out)
    elif n.op == "cast":
        out.copy_(args[0])
    elif n.op == "concat":
        torch.cat(args, n.attr("dim"), out=out)
    else:
        raise NotImplementedError(f"runtime: no torch form for library op {n.op!r}")
