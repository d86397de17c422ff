"""The torch Domain: executes a μGraph with torch ops in the tensors' own dtype.

It is the CPU backend of ``mirage_serve.patch`` (slow but exact to the tiling) and a second
numeric reference on GPU. Reductions and matmuls run in the operands' dtype like the model's
own code would; accumulators follow the dtypes the μGraph declares.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir import DTYPES

TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}  # the IR names dtypes as torch does

_UNARY = {
    "exp": torch.exp,
    "neg": torch.neg,
    "square": torch.square,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    # ---- activations (issue 27, search-ops)
    "gelu": F.gelu,
    "erf": torch.erf,
    "relu": torch.relu,
    # ---- end of the activations block
}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum}


class TorchDomain:
    name = "torch"

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)

    def const(self, value, dtype):
        return torch.tensor(value, dtype=TORCH_DTYPES[dtype], device=self.device)

    def unary(self, op, x):
        return _UNARY[op](x)

    def binary(self, op, a, b):
        return _BINARY[op](a, b)

    def reduce(self, op, x, axis, keepdim):
        if op == "reduce_sum":
            return torch.sum(x, dim=axis, keepdim=keepdim)
        return torch.amax(x, dim=axis, keepdim=keepdim)

    def matmul(self, a, b):
        return torch.matmul(a, b)

    def cast(self, x, dtype):
        return x.to(TORCH_DTYPES[dtype])

    def shape(self, x):
        return tuple(x.shape)

    def reshape(self, x, shape):
        return x.reshape(tuple(shape))

    def permute(self, x, axes):
        return x.permute(*axes)

    def concat(self, xs, axis):
        return torch.cat(list(xs), dim=axis)

    def slice(self, x, axis, start, stop):
        return x.narrow(axis, start, stop - start)

    def broadcast_to(self, x, shape):
        return x.expand(*shape)

    def index_input(self, values):
        """Positions (gather / scatter indices, ``interp.movement``) as an int64 tensor."""
        return torch.as_tensor(values, dtype=torch.int64, device=self.device)
