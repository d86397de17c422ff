"""Projections that read one input, stacked into one: q, k and v of a layer as one GEMV.

A norm site's consumers each read the normed input. Searched apart (``sites.site_parts``), each is a
program and a launch of its own (k and v one paired launch at best): at 0.5–1B a launch moving a
few MB costs about as much in fixed time as in bytes (docs/architecture.md, "Stacked
projections"). With their weights stacked row-wise into one ``[ΣN, D]`` matrix the plain
``nn.Linear`` consumers are one projection: one program for the search, whose grid tiles all their
columns, one launch, and one output whose column blocks are the consumers' outputs (``splits``,
taken as views).

The stacked weight holds the consumers' own values, so nothing is duplicated: their weights become
views of it (the parameters stay the same objects, with equal values). A later call on the same
consumers finds their weights already adjacent in one storage and views it again, so each layer's
weights are stacked once however often its site is traced.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["stackable", "stack_linears"]


def stackable(modules: list[nn.Module]) -> bool:
    """Whether ``modules`` (two or more) are plain ``nn.Linear``s that can share one weight: same input
    size, dtype and device, all with a bias or none, weights that are plain tensors in memory (not
    meta, not offloaded behind a hook, not a tensor subclass such as a DTensor)."""
    if len(modules) < 2 or any(type(m) is not nn.Linear for m in modules):
        return False
    w0 = modules[0].weight
    for m in modules:
        w, b = m.weight, m.bias
        if type(w.data) is not torch.Tensor or w.is_meta or hasattr(m, "_hf_hook"):
            return False
        if w.dim() != 2 or w.shape[1] != w0.shape[1] or w.dtype != w0.dtype or w.device != w0.device:
            return False
        if (b is None) != (modules[0].bias is None):
            return False
    return True


def stack_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One ``nn.Linear`` computing ``cat([l(x) for l in linears], -1)``, its weight (and bias) shared with
    theirs (the module docstring). ``linears`` must be ``stackable``."""
    weight = _stacked([m.weight for m in linears])
    bias = _stacked([m.bias for m in linears]) if linears[0].bias is not None else None
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta", dtype=weight.dtype)
    out.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        out.bias = nn.Parameter(bias, requires_grad=False)
    return out


def _stacked(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters' values stacked along dim 0, in the storage they then all view."""
    if _adjacent(params):  # stacked before: view the storage they share
        first = params[0]
        rows = sum(p.shape[0] for p in params)
        return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(),
                                       (rows, *first.shape[1:]), first.stride())
    with torch.no_grad():
        stacked = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:  # each parameter now views its rows of the stacked tensor: its old storage is freed
        p.data = stacked[start:start + p.shape[0]]
        start += p.shape[0]
    return stacked


def _adjacent(params: list[torch.Tensor]) -> bool:
    """Contiguous tensors, each starting where the one before ends, in one storage."""
    if not all(p.is_contiguous() for p in params):
        return False
    ptr = params[0].untyped_storage().data_ptr()
    end = params[0].storage_offset()
    for p in params:
        if p.untyped_storage().data_ptr() != ptr or p.storage_offset() != end:
            return False
        end += p.numel()
    return True
