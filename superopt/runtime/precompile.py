"""Compile a μGraph's Triton kernels into Triton's on-disk cache without a GPU and without running them.

``patch()`` verifies the μGraph of a shipped or imported cache entry in worker processes before it
may build it (docs/architecture.md, "Cache trust"). Compiling the entry's kernels meanwhile, in the
same workers, turns the build that follows a passed verification into a load from Triton's cache
(Triton's hash covers the source, the options and the target, so the build finds exactly these
binaries or compiles its own). Nothing is launched: a μGraph that then fails verification has run
nothing. The source is rendered here from the μGraph, as ``compile_graph`` renders it.
"""
from __future__ import annotations

from ..codegen.launch import Launch
from ..codegen.triton import render_built
from ..ir import from_text
from .binaries import warmup
from .build import load_module


def precompile(text: str, launch: dict[str, Launch] | None, pdl: bool, target, ordered_sums: bool = False) -> int:
    """Compile every kernel of the μGraph ``text`` as ``compile_graph(graph, launch=launch)`` with
    dependent launch ``pdl`` (already resolved for the device) and ``ordered_sums`` would on a GPU of ``target``
    (a ``GPUTarget``); the number of kernels Triton compiled (0: all were in its cache)."""
    launch = {k: Launch.of(v) for k, v in (launch or {}).items()}
    tm, launch = render_built(from_text(text), launch, ordered_sums, pdl=pdl)
    if not tm.kernels:
        return 0
    return len(warmup(tm, load_module(tm), launch, target=target).compiled)
