"""The kernel of one site at one bucket, and the call that runs it on the activations alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import backends


@dataclass(frozen=True)
class BucketKernel:
    """The kernel of one site at one bucket of M rows: its executor and its inputs in order."""

    executor: backends.Executor
    feeds: tuple  # per μGraph input: a parameter tensor, or None where the activation x goes
    rows: int
    bound: Callable | None = None  # a call on the activations replacing the executor's (patch_pairing)


def bound_call(k: BucketKernel):
    """``k``'s executor as a call on the activations alone (its weights bound once, where the
    executor can: ``CompiledGraph.bind``), or ``k.bound`` where given."""
    if k.bound is not None:
        return k.bound
    bind = getattr(k.executor.run, "bind", None)
    if bind is not None:
        return bind(k.feeds)
    feeds, run = k.feeds, k.executor.run
    return lambda x2: run(*[x2 if f is None else f for f in feeds])
