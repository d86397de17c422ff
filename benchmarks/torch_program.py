"""A Lax program as plain PyTorch code: the eager baseline, torch.compile's input, and the reference.

Each node becomes the torch call a model author would write (``x * 0.5`` with a Python scalar,
``torch.matmul``, ``torch.sum``), in the inputs' dtype, so the baselines are what PyTorch does with
the same program; with float64 inputs it is the float64 reference (its casts keep float64). No host-to-device copies, so
the function can be captured in a CUDA graph.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from superopt.ir import KernelGraph

_UNARY = {"exp": torch.exp, "neg": torch.neg, "square": torch.square, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
          "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
          "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}
_SCALAR_UNARY = {"exp": math.exp, "neg": operator.neg, "square": lambda x: x * x, "sqrt": math.sqrt,
                 "rsqrt": lambda x: 1.0 / math.sqrt(x)}
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


def torch_program(program: KernelGraph):
    """``f(*tensors) -> list[Tensor]`` running ``program`` op by op with torch."""
    def f(*xs):
        env = dict(zip((v.name for v in program.inputs), xs))
        for n in program.nodes:
            a = [env[x] for x in n.args]
            op = n.op
            if op == "const":
                r = float(n.attr("value"))
            elif op in _UNARY:
                r = _UNARY[op](a[0]) if isinstance(a[0], torch.Tensor) else _SCALAR_UNARY[op](a[0])
            elif op in _BINARY:
                r = _BINARY[op](a[0], a[1])
            elif op == "max":
                r = torch.maximum(a[0], a[1])
            elif op == "reduce_sum":
                r = torch.sum(a[0], n.attr("dim"), keepdim=bool(n.attr("keepdim")))
            elif op == "reduce_max":
                r = torch.amax(a[0], n.attr("dim"), keepdim=bool(n.attr("keepdim")))
            elif op == "matmul":
                r = torch.matmul(a[0], a[1])
            elif op == "transpose":
                r = a[0].transpose(-1, -2)
            elif op == "reshape":
                r = a[0].reshape(n.attr("shape"))
            elif op == "slice":
                r = a[0].narrow(n.attr("dim"), n.attr("start"), n.attr("stop") - n.attr("start"))
            elif op == "concat":
                r = torch.cat(a, n.attr("dim"))
            elif op == "cast":  # the float64 reference stays float64: it is the exact result, not a rounding model
                r = a[0] if a[0].dtype == torch.float64 else a[0].to(getattr(torch, n.attr("dtype")))
            else:
                raise NotImplementedError(op)
            env[n.out.name] = r
        return [env[o] for o in program.outputs]
    return f
