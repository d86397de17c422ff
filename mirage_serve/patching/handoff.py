"""The hand-off between a decoder layer's forward and the projection that does its residual add.

The layer offers the residual to a ``ResidualSlot``; the projection (``proj_forward``) takes it only
when it runs its kernel on that call and records its output, and the layer's add (or a post-norm,
``post_forward``) recognises that output by identity. ``hooked`` says when a hook could see a
tensor that differs from the original forward's, so nothing is offered (patching/residual.py, and
docs/architecture.md, "Residual adds").
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as nn_module

__all__ = ["ResidualSlot", "hooked", "post_forward", "proj_forward"]


class ResidualSlot:
    """Hands one residual from a layer's forward to one projection call, and records what it did."""

    __slots__ = ("residual", "taken", "out", "proj")

    def __init__(self, proj: nn.Module | None = None):
        self.residual = self.taken = self.out = None
        self.proj = proj  # the projection module it feeds (its hooks matter)

    def offer(self, r: torch.Tensor) -> None:
        self.residual, self.taken, self.out = r, None, None

    def take(self) -> torch.Tensor | None:
        """The residual offered for this call (once), or None."""
        r, self.residual = self.residual, None
        self.taken = r
        return r

    def clear(self) -> None:
        self.residual = self.taken = self.out = None


def proj_forward(module: nn.Module, runtime, slot: ResidualSlot):
    """``module.forward`` running ``r + x Wᵀ`` in one kernel when ``slot`` holds a residual for it."""
    original = module.forward

    def forward(x, *args, **kwargs):
        r = slot.take()
        if r is None or args or kwargs or not runtime.eligible(module, x, r):
            return original(x, *args, **kwargs)
        out = runtime.run(x, r)[0]
        slot.out = out
        return out
    forward.residual_slot = slot  # for a caller that must see the projection alone (attention_fast)
    return forward


def post_forward(module: nn.Module, slot: ResidualSlot):
    """``module.forward`` for a post-norm computed inside the projection's kernel: called on exactly
    that kernel's output, it returns it as it is (the norm and the add are in it); else the original."""
    original = module.forward

    def forward(x, *args, **kwargs):
        if slot.out is not None and x is slot.out and not args and not kwargs:
            return x
        return original(x, *args, **kwargs)
    return forward


def hooked(modules) -> bool:
    """Whether a forward hook (global or on one of ``modules``) could see a tensor that differs from
    the original forward's: a deferred norm's placeholder (patching.install), a projection's output with
    the residual already in it. transformers records ``output_hidden_states`` and ``output_attentions``
    with such hooks."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_pre_hooks or any(not _idle(h) for h in m._forward_hooks.values()) for m in modules)


def _idle(hook) -> bool:
    """A transformers output-capturing hook that records nothing on this call: installed on the
    layers by the first ``output_hidden_states`` (or ``output_attentions``) call and left there, it
    records only the outputs the current call asked for. (Private transformers API: anything
    unexpected counts the hook as active.)"""
    if getattr(hook, "__name__", "") != "output_capturing_hook":
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
        key = hook.__closure__[hook.__code__.co_freevars.index("key")].cell_contents
        collected = _active_collector.get()
    except (ImportError, AttributeError, ValueError, IndexError, TypeError):
        return False
    return collected is None or key not in collected
