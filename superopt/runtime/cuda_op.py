"""A CudaGraphRunner as a ``torch.library`` custom op, so a CUDA μGraph works inside torch.compile.

The op is functional: ``superopt_cuda::<name>(Tensor[] inputs) -> Tensor[]`` returns copies of the
runner's preallocated outputs (one small copy per output; decode outputs are a few KB), so the
compiled graph never aliases the runner's buffers. Its fake implementation gives the output
shapes and dtypes from the μGraph, which is all torch.compile needs to trace around it.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..codegen.common import identifier
from .cuda_launch import CudaGraphRunner
from .dtypes import TORCH_DTYPES

OP_NAMESPACE = "superopt_cuda"
_OPS: dict[str, Callable] = {}


def as_custom_op(runner: CudaGraphRunner, name: str) -> Callable[..., list[torch.Tensor]]:
    """Register ``runner`` as ``superopt_cuda::<name>`` (once per name) and return the op."""
    qualname = f"{OP_NAMESPACE}::{identifier(name)}"
    if qualname in _OPS:
        return _OPS[qualname]
    out_types = runner.graph.output_types

    @torch.library.custom_op(qualname, mutates_args=())
    def op(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [o.clone() for o in runner(*inputs)]

    @op.register_fake
    def _(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        device = inputs[0].device if inputs else runner.device
        return [torch.empty(t.shape, dtype=TORCH_DTYPES[t.dtype], device=device) for t in out_types]

    _OPS[qualname] = op
    return op
