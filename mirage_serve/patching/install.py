"""Install prepared sites into a model by per-instance ``forward`` replacement, and undo it.

A ``NormSite`` runs its fused kernel when the norm is called: the norm returns ``n`` (the kernel's
first output) and leaves the consumers' outputs in a per-site hand-off, keyed by the identity of
``n``. Each consumer (``q_proj``, ``mlp``…) returns its result from the hand-off when it is called
with exactly that tensor (then applies its ``tail``, e.g. ``down_proj``), and otherwise runs its
original forward. So correctness never rests on the hand-off: any other call, a prefill-sized
input, a training-mode module, a dtype or device mismatch, all take the original path.

A norm whose site runs it as a program of its own (``PartsRuntime.norm_part``) is deferred: the
norm returns a placeholder ``n`` and runs only the consumers' kernels. In the layers of every
family the adapters declare, the norm's output goes to its consumers and nowhere else, so on a
decode step the norm kernel is never needed (one launch per norm saved). The placeholder is filled
(``_Handoff.materialize``) before any consumer falls back to its original forward with ``n`` or a
view of it, and nothing is deferred while a hook on the norm or a consumer could read it.

Only instance attributes named ``forward`` are set; parameters, buffers, module names and
``state_dict`` stay exactly as they were (stacked q/k/v move their weights' storage, not their values:
``stacking``), and `restore` puts back what was there before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .prepare import PartsRuntime, SiteRuntime
from .handoff import ResidualSlot, hooked, post_forward, proj_forward
from .sites import NormSite, ProjSite

_MISSING = object()


@dataclass(frozen=True)
class Record:
    """What one module's ``forward`` instance attribute was before patching (or _MISSING)."""

    module: torch.nn.Module
    previous: object


class _Handoff:
    __slots__ = ("key", "values", "pending")

    def __init__(self):
        self.key = None
        self.values: dict[int, torch.Tensor] = {}
        self.pending = None  # (placeholder n, x, fill(x) -> n) of a deferred norm

    def materialize(self, x) -> None:
        """Compute the deferred norm output into its placeholder if ``x`` is it or a view of it."""
        if self.pending is None or not isinstance(x, torch.Tensor):
            return
        n, src, fill = self.pending
        if x.untyped_storage().data_ptr() == n.untyped_storage().data_ptr():
            self.pending = None
            n.copy_(fill(src))

    def take(self, x, i: int):
        if self.key is not x or i not in self.values:
            return None
        y = self.values.pop(i)
        if not self.values:
            self.key = None  # all consumers served: drop the reference to n
        return y


def set_forward(module: torch.nn.Module, fn, records: list[Record]) -> None:
    records.append(Record(module, module.__dict__.get("forward", _MISSING)))
    module.forward = fn


def restore(records: list[Record]) -> None:
    for r in reversed(records):
        if r.previous is _MISSING:
            module_dict = r.module.__dict__
            module_dict.pop("forward", None)
        else:
            r.module.forward = r.previous


def _proj_forward(module, runtime: SiteRuntime, tail=None, escapes: bool = False):
    original = module.forward

    def forward(x, *args, **kwargs):
        if args or kwargs or not runtime.eligible(module, x):
            return original(x, *args, **kwargs)
        y = runtime.run(x)[0]
        if escapes and not _capturing():  # a graph's outputs are its static buffers anyway
            y = y.clone()
        return y if tail is None else tail(y)
    return forward


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _norm_forward(module, runtime: SiteRuntime, handoff: _Handoff, watched: list):
    original = module.forward
    deferrable = isinstance(runtime, PartsRuntime)

    def forward(x, *args, **kwargs):
        handoff.pending = None
        if args or kwargs or not runtime.eligible(module, x):
            return original(x, *args, **kwargs)
        if deferrable and runtime.norm_like_input and not hooked(watched):
            rest = runtime.run_consumers(x)
            n = torch.empty_like(x)
            handoff.pending = (n, x, runtime.run_norm)
        else:
            n, *rest = runtime.run(x)
        handoff.key, handoff.values = n, dict(enumerate(rest))
        return n
    return forward


def _consumer_forward(module, i: int, tail, handoff: _Handoff):
    original = module.forward

    def forward(x, *args, **kwargs):
        y = None if (args or kwargs) else handoff.take(x, i)
        if y is None:
            handoff.materialize(x)
            return original(x, *args, **kwargs)
        return y if tail is None else tail(y)
    return forward


def install(layer: torch.nn.Module, site: NormSite | ProjSite, runtime: SiteRuntime,
            records: list[Record], residual_slot: ResidualSlot | None = None) -> None:
    """Swap the forwards of one site's modules in ``layer``; appends what it changed to ``records``.
    A projection with the residual fused in (``site.residual``) takes it from ``residual_slot``,
    which the layer's forward fills (``patching.handoff``, ``patching.residual``)."""
    if isinstance(site, ProjSite):
        proj = layer.get_submodule(site.proj)
        if site.residual:
            set_forward(proj, proj_forward(proj, runtime, residual_slot), records)
            if site.post:  # the post-norm is inside the kernel too: it passes that output on
                post = layer.get_submodule(site.post)
                set_forward(post, post_forward(post, residual_slot), records)
        else:
            tail = proj.get_submodule(site.tail) if site.tail else None
            set_forward(proj, _proj_forward(proj, runtime, tail, site.escapes), records)
        return
    handoff = _Handoff()
    norm = layer.get_submodule(site.norm)
    watched = [norm]
    for i, c in enumerate(site.consumers):
        mod = layer.get_submodule(c.path)
        watched.append(mod)
        tail = mod.get_submodule(c.tail) if c.tail else None
        set_forward(mod, _consumer_forward(mod, i, tail, handoff), records)
    set_forward(norm, _norm_forward(norm, runtime, handoff, watched), records)
