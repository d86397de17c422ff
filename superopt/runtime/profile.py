"""Pick the fastest of several verified μGraphs and their launch parameters by measurement.

Every candidate is built with each launch configuration (num_warps, num_stages, applied to all
its kernels), timed as a CUDA-graph replay over input sets rotated beyond L2, and ranked by its
median time. A candidate that fails to build or run is kept in the result with its error, so
the caller sees why it lost.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from ..ir import KernelGraph, launch_fits, to_text
from ..ir.chain import chains
from ..ir.registers import registers_fit
from .compiled import compile_graph
from .timing import rotated_sets, time_call

# (num_warps, num_stages[, prefetch[, chain]]). Measured on an H200 (benchmarks/results/blocks_triton_h200.md):
# decode GEMVs ran fastest on 2 warps, attention on 4-8, so both ends stay in the default sweep. A
# third element 1 renders the kernels with the next iteration's loads issued ahead (codegen.triton
# ``prefetch``); it is timed only for graphs with a for-loop. A fourth element 1 runs a kernel's
# consumer in its last blocks where ``ir.chain`` allows (a split kernel and its combine in one
# launch), timed only for graphs with such a pair: on an H100 it lost to two launches (with
# programmatic dependent launch) at every attention tiling that was competitive, by up to 1.8×
# where the last block loops over a GQA group (benchmarks/results/blocks_h100_2026-11-25_s17.md),
# so it is swept over the few fastest candidates only, not probed on every one.
DEFAULT_CONFIGS = ((2, 3), (2, 4), (4, 3), (4, 4), (8, 3), (2, 3, 1), (4, 3, 1), (2, 3, 0, 1), (4, 3, 0, 1))


@dataclass(frozen=True)
class ProfileResult:
    index: int                  # position in the candidate list
    ugraph: KernelGraph
    launch: dict = field(default_factory=dict)  # kernel name -> (num_warps, num_stages)
    median_us: float = float("inf")
    tried: tuple = ()           # ((num_warps, num_stages), median_us) for every config timed
    error: str | None = None


def profile_candidates(ugraphs: Sequence[KernelGraph], example_inputs: Sequence[torch.Tensor],
                       configs: Sequence[tuple[int, int] | None] = DEFAULT_CONFIGS, reps: int = 30,
                       backend: str = "triton", refused: Mapping = {}) -> list[ProfileResult]:
    """Rank ``ugraphs`` (all computing the same program) by median time on ``example_inputs``.

    A ``None`` config launches every kernel with the renderer's own choice for it. ``refused``:
    (μGraph text, config) -> reason, launches not to build in this process (``Selector``: their
    build crashed a worker)."""
    sets = rotated_sets(example_inputs)
    results = []
    for i, g in enumerate(ugraphs):
        best, tried, err = None, [], None
        for config in configs:
            if config is not None and not applies(g, config):
                continue
            why = refused.get(launch_key(to_text(g), config)) if refused else None
            if why is not None:
                err = f"skipped {config_label(config)}: {why}"
                continue
            if not fits(g, config):  # Triton would refuse the launch, or spill and compile for minutes
                err = f"skipped {config_label(config)}: over the sm_90 shared memory (ir.smem) or registers (ir.registers)"
                continue
            try:
                launch = None if config is None else {k.name: tuple(config) for k in _kernels(g)}
                cg = compile_graph(g, backend=backend, device=example_inputs[0].device, launch=launch)
                us = time_call(cg, sets, graph=True, reps=reps)
            except Exception as e:  # a candidate that cannot build or run loses, with its reason
                err = f"{type(e).__name__}: {e}"
                continue
            tried.append((config, us))
            if best is None or us < best[1]:
                best = (cg.launch, us)
        if best is None:
            results.append(ProfileResult(i, g, error=err))
        else:
            results.append(ProfileResult(i, g, best[0], best[1], tuple(tried)))
    return sorted(results, key=lambda r: r.median_us)


def launch_key(text: str, config) -> tuple[str, tuple | None]:
    """A candidate launch's key in ``refused``: its μGraph's text and its config (None: the default)."""
    return text, None if config is None else tuple(config)


def config_label(c: tuple | None) -> str:
    """w<num_warps>s<num_stages>, with "p" for a prefetch-rendered launch and "c" for a chained one;
    None: the renderer's default."""
    if c is None:
        return "default"
    return f"w{c[0]}s{c[1]}" + ("p" if len(c) > 2 and c[2] else "") + ("c" if len(c) > 3 and c[3] else "")


def fits(g: KernelGraph, config: tuple | None) -> bool:
    """Whether ``g``'s kernels fit the GPU's shared memory (``ir.launch_fits``) and a thread's registers
    (``ir.registers``) at ``config`` (None: the renderer's default launch, whose stages fit by construction)."""
    if config is None:
        return registers_fit(g)
    return registers_fit(g, config[0]) and launch_fits(g, config[0], config[1],
                                                       chained=len(config) > 3 and bool(config[3]))


def applies(g: KernelGraph, config: tuple) -> bool:
    """Whether ``config`` changes anything for ``g``: a prefetch variant needs a kernel with a
    for-loop, a chained one a kernel that can run its consumer (``ir.chain``)."""
    if len(config) > 2 and config[2] and not any(n.block.forloop > 1 for n in g.customized_nodes()):
        return False
    return len(config) < 4 or not config[3] or bool(chains(g))


def _kernels(g: KernelGraph):
    from ..codegen.triton import render_triton
    return render_triton(g).kernels
