"""The kernel of one site at one bucket, and the call that runs it on the activations alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import backends


@dataclass(frozen=True)
class BucketKernel:
    """The kernel of one site at one bucket of M rows: its executor and its inputs in order."""

    executor: backends.Executor
    feeds: tuple  # per μGraph input: a parameter tensor, or None where an activation goes
    rows: int
    bound: Callable | None = None  # a call on the activations replacing the executor's (patching.pairing)
    acts: tuple = (0,)  # per None in ``feeds``, in order: which activation (0: x, 1: the residual)
    # the μGraph's one output is several projections' outputs side by side (patching.stacking): their
    # widths, each handed out as a view of its columns
    splits: tuple[int, ...] = ()


def bound_call(k: BucketKernel):
    """``k``'s executor as a call on the activations alone, ``call(x)`` or ``call(x, r)`` (its
    weights bound once, where the executor can: ``CompiledGraph.bind``), or ``k.bound`` where given;
    a stacked output (``k.splits``) comes back split."""
    if k.bound is not None:
        return k.bound
    call = _weights_bound(k)
    if not k.splits:
        return call
    return lambda *acts: list(call(*acts)[0].split(k.splits, dim=-1))


def _weights_bound(k: BucketKernel):
    bind = getattr(k.executor.run, "bind", None)
    if bind is not None:
        call = bind(k.feeds)
    else:
        feeds, run = k.feeds, k.executor.run

        def call(*given):
            it = iter(given)
            return run(*[next(it) if f is None else f for f in feeds])
    if k.acts == tuple(range(len(k.acts))):  # the μGraph takes the activations in their own order
        return call
    order = k.acts
    return lambda *acts: call(*[acts[i] for i in order])
