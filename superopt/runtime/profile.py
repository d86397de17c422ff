"""Pick the fastest of several verified μGraphs and their launch parameters by measurement.

Every candidate is built with each launch configuration (num_warps, num_stages, applied to all
its kernels), timed as a CUDA-graph replay over input sets rotated beyond L2, and ranked by its
median time. A candidate that fails to build or run is kept in the result with its error, so
the caller sees why it lost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from ..codegen.launch import Launch, unordered
from ..codegen.triton import render_triton
from ..ir import KernelGraph, launch_fits, to_text
from ..ir.chain import chains
from ..ir.registers import registers_fit
from .compiled import compile_graph
from .timing import context_alive, rotated_sets, time_call

# Measured on an H200 (benchmarks/results/blocks_triton_h200.md):
# decode GEMVs ran fastest on 2 warps, attention on 4-8, so both ends stay in the default sweep. A
# ``prefetch`` launch renders the kernels with the next iteration's loads issued ahead (codegen.triton);
# it is timed only for graphs with a for-loop. A ``chain`` launch runs a kernel's
# consumer in its last blocks where ``ir.chain`` allows (a split kernel and its combine in one
# launch), timed only for graphs with such a pair: on an H100 it lost to two launches (with
# programmatic dependent launch) at every attention tiling that was competitive, by up to 1.8×
# where the last block loops over a GQA group (benchmarks/results/blocks_h100_2026-11-25_s17.md),
# so it is swept over the few fastest candidates only, not probed on every one.
DEFAULT_CONFIGS = (Launch(2, 3), Launch(2, 4), Launch(4, 3), Launch(4, 4), Launch(8, 3),
                   Launch(2, 3, prefetch=True), Launch(4, 3, prefetch=True),
                   Launch(2, 3, chain=True), Launch(4, 3, chain=True))


class ContextLost(RuntimeError):
    """A candidate's launch broke the process's CUDA context (an illegal address): no later launch
    can run. The message names the candidate, its launch and its μGraph, to reproduce it alone;
    ``key`` (``launch_key``) is what a fresh process passes to ``Selector.refuse``."""

    def __init__(self, message: str, key: tuple[str, Launch | None]):
        super().__init__(message)
        self.key = key


GIVE_UP = 3.0  # a launch this many times the fastest timed so far is timed once, not ``reps`` times


@dataclass(frozen=True)
class ProfileResult:
    index: int                  # position in the candidate list
    ugraph: KernelGraph
    launch: dict = field(default_factory=dict)  # kernel name -> Launch
    median_us: float = float("inf")
    tried: tuple = ()           # (Launch or None, median_us) for every config timed
    error: str | None = None
    seconds: float = 0.0        # wall time this process spent building and timing it (a build cache miss shows)


def profile_candidates(ugraphs: Sequence[KernelGraph], example_inputs: Sequence[torch.Tensor],
                       configs: Sequence[Launch | None] = DEFAULT_CONFIGS, reps: int = 30,
                       backend: str = "triton", refused: Mapping = {}, pdl: bool = True,
                       in_place: Sequence[str] = (), ordered_sums: bool = False) -> list[ProfileResult]:
    """Rank ``ugraphs`` (all computing the same program) by median time on ``example_inputs``.

    Each config is applied to every kernel of a candidate; a ``None`` config launches every kernel
    with the renderer's own choice for it. ``pdl``: built with programmatic dependent launch where
    the GPU has it, as the chosen kernels will run (``PatchOptions.pdl``). ``refused``:
    (μGraph text, config) -> reason, launches not to build in this process (``Selector``: their
    build crashed a worker). ``in_place``: inputs each candidate writes in place (a decode step's cache,
    ``compile_graph(in_place=…)``), as it will run: its cache writes then cost what they will. ``ordered_sums``:
    cross-block sums timed in their fixed-order form, as ``PatchOptions.deterministic`` will run them; the launch
    returned leaves the ordering out, since the build adds it from the setting (``compile_graph(ordered_sums=)``)."""
    sets = rotated_sets(example_inputs)
    results, fastest = [], float("inf")
    for i, g in enumerate(ugraphs):
        best, tried, err, t0 = None, [], None, time.perf_counter()
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
                launch = None if config is None else {k.name: config for k in _kernels(g)}
                cg = compile_graph(g, backend=backend, device=example_inputs[0].device, launch=launch, pdl=pdl,
                                   in_place=in_place, ordered_sums=ordered_sums)
                # a launch GIVE_UP× the fastest so far loses whatever its median: one rep says so (GQA b8's
                # 3-6 ms launches, 30 reps each, took much of its row's 246 s of profiling)
                us = time_call(cg, sets, graph=True, reps=reps, give_up_us=GIVE_UP * fastest)
            except Exception as e:  # a candidate that cannot build or run loses, with its reason
                if not context_alive(example_inputs[0].device):
                    raise ContextLost(f"candidate {i} at launch {config_label(config)} broke the CUDA context "
                                      f"({type(e).__name__}: {str(e).splitlines()[0]}); its μGraph:\n{to_text(g)}",
                                      launch_key(to_text(g), config)) from e
                err = f"{type(e).__name__}: {e}"
                continue
            fastest = min(fastest, us)
            tried.append((config, us))
            if best is None or us < best[1]:
                best = (unordered(cg.launch), us)
        took = time.perf_counter() - t0
        if best is None:
            results.append(ProfileResult(i, g, error=err, seconds=took))
        else:
            results.append(ProfileResult(i, g, best[0], best[1], tuple(tried), seconds=took))
    return sorted(results, key=lambda r: r.median_us)


def launch_key(text: str, config: Launch | None) -> tuple[str, Launch | None]:
    """A candidate launch's key in ``refused``: its μGraph's text and its config (None: the default)."""
    return text, config


def config_label(c: Launch | None) -> str:
    """``Launch.label`` (w<num_warps>s<num_stages>, "p" for prefetch, "c" for chain); None: "default"."""
    return "default" if c is None else c.label


def fits(g: KernelGraph, config: Launch | None) -> bool:
    """Whether ``g``'s kernels fit the GPU's shared memory (``ir.launch_fits``) and a thread's registers
    (``ir.registers``) at ``config`` (None: the renderer's default launch, whose stages fit by construction)."""
    if config is None:
        return registers_fit(g)
    return registers_fit(g, config.num_warps) and launch_fits(g, config.num_warps, config.num_stages,
                                                              chained=config.chain)


def applies(g: KernelGraph, config: Launch) -> bool:
    """Whether ``config`` changes anything for ``g``: a prefetch variant needs a kernel with a
    for-loop, a chained one a kernel that can run its consumer (``ir.chain``)."""
    if config.prefetch and not any(n.block.forloop > 1 for n in g.customized_nodes()):
        return False
    return not config.chain or bool(chains(g))


def _kernels(g: KernelGraph):
    return render_triton(g).kernels
