"""Choose the fastest verified μGraph and launch configuration for one program by timing them.

The search ranks designs with a cost model that cannot see per-block latency or what Triton makes
of a tile; the GPU can. ``Selector.pick`` times every candidate (the search's best designs and each
at other extents, ``SearchResult.candidates``) at a few probe launches (``PROBE``), then sweeps the
launch configurations (num_warps, num_stages) over the fastest few, and returns all results, best
first.

Compiling dominates: a Triton kernel takes about a second to build and timing it takes
milliseconds. So each stage first builds its kernels in worker processes (``spawn``; each builds
and launches once, which leaves the binary in Triton's on-disk cache), then times them one by
one in this process, where the build is then a cache hit. Timings never share the GPU with a build.
A build that kills its worker (the Triton compiler aborting on an LLVM assertion: seen on the H200
in the eleventh session) is found and its candidate launch is never built in this process, where
it would abort the caller (a patch() or a benchmark) with it. So is a candidate whose one launch in
the worker breaks the worker's CUDA context (an illegal memory access, a device-side assert: such an
error is sticky, every later CUDA call of that process fails): the worker then ends itself
(``_build_once``), which blames that launch alone, and the caller's context never runs it. Before,
the worker reported the error and went on, and the caller then timed the candidate itself: in the
thirtieth session a searched GQA b8 candidate took down the block benchmark's context, most likely
that way (its workers had launched every candidate first, at the same launches and shapes).
A build that never ends (a compiler that loops, a launch that hangs the worker's GPU stream) is found the same
way: when no build has finished for ``BUILD_STALL_S``, the pool is killed and the unfinished builds run one at a
time, each given ``BUILD_STALL_S``; the one that runs past it is refused, so a pick gets slower, never stuck.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Callable, Sequence

import torch

from ..codegen.launch import Launch
from ..codegen.triton import render_triton
from ..ir import KernelGraph, from_text, to_text
from . import procs
from .compiled import compile_graph
from .profile import DEFAULT_CONFIGS, ProfileResult, applies, fits, launch_key, profile_candidates
from .timing import context_alive, rotated_sets, time_call

SWEEP_TOP = 3  # candidates whose launch configurations are swept after the first stage
# The first stage's launches: the renderer's default (4 warps, 3 stages for 128 threads), 2 warps,
# and 4 warps with the next iteration's loads issued ahead. A decode GEMV's best design can be 2-3x
# slower at its default than at its best launch (Llama-3.1-8B q_proj at 8 rows, H200: 33.7 µs at
# the best of default and 2 warps, 17.4 µs at 2 warps prefetched: the shipped entry), so timed at the default alone it fell out
# of the swept few once the search offered 14 candidates instead of 7 (ninth session). Over the 29
# candidates the ninth session's block benchmark timed at every launch, these three came within
# 10% of each one's best (26 within 5%); default and 2 warps alone: within 41% (20 within 5%).
PROBE = (None, Launch(2, 3), Launch(4, 3, prefetch=True))


# No build finished for this long: the running ones are stuck. A build is a Triton compile (seconds) and one launch;
# the slowest the search's designs took, before the register cap (superopt.ir.registers), was 143 s.
BUILD_STALL_S = 180.0
CRASHED = "killed its worker process (a compiler crash, or a CUDA error that breaks the context)"
STUCK = "ran past {:.0f} s alone in its worker (a compiler that loops, or a launch that hangs)"  # .format(stall)


def default_workers() -> int:
    return max(1, min(12, (os.cpu_count() or 2) - 2))


class Selector:
    """Profiles candidates on ``device``; holds a pool of build workers until ``close()``. ``pdl``:
    candidates are built with programmatic dependent launch where the GPU has it (``PatchOptions.pdl``);
    ``in_place``: the inputs they write in place, and ``ordered_sums``: their cross-block sums in a fixed order, as
    they will run (``profile_candidates``)."""

    def __init__(self, device: torch.device, workers: int | None = None,
                 configs: Sequence[Launch] = DEFAULT_CONFIGS, pdl: bool = True, in_place: Sequence[str] = (),
                 ordered_sums: bool = False):
        self.device = torch.device(device)
        self.pdl, self.ordered_sums = pdl, ordered_sums
        self.in_place = tuple(in_place)
        self.workers = default_workers() if workers is None else workers
        self.configs = tuple(configs)
        self._pool = None
        # (μGraph text, launch) -> why it is not built here: its build killed a worker process
        self._refused: dict[tuple[str, Launch | None], str] = {}
        self.stage_seconds: dict[str, float] = {}  # the last pick's wall seconds per stage, for logs

    def pick(self, candidates: Sequence[KernelGraph], inputs: Sequence[torch.Tensor],
             sweep_also: Sequence[KernelGraph] = ()) -> list[ProfileResult]:
        """Every candidate timed (best first); errors (e.g. out of shared memory) rank last.
        ``sweep_also``: candidates whose launches are swept wherever their probes rank (an
        incumbent whose best launch is known to be one the probes leave out)."""
        unique = list({to_text(g): g for g in candidates}.values())
        clock = _StageClock()
        self._prebuild([(g, c) for g in unique for c in PROBE
                        if (c is None or applies(g, c)) and fits(g, c)], inputs)
        clock.lap("probe builds")
        first = profile_candidates(unique, inputs, configs=PROBE, refused=self._refused, pdl=self.pdl,
                                   in_place=self.in_place, ordered_sums=self.ordered_sums)
        clock.lap("probe timing")
        top = [r.ugraph for r in first if r.error is None][:SWEEP_TOP]
        top += [g for g in sweep_also if g not in top]
        # configs whose shared memory cannot fit are skipped by the timing pass: do not build them
        self._prebuild([(g, c) for g in top for c in self.configs if applies(g, c) and fits(g, c)],
                       inputs)
        clock.lap("sweep builds")
        swept = profile_candidates(top, inputs, configs=self.configs, refused=self._refused, pdl=self.pdl,
                                   in_place=self.in_place, ordered_sums=self.ordered_sums)
        clock.lap("sweep timing")
        self.stage_seconds = clock.laps
        best = {to_text(r.ugraph): r for r in first}
        spent = {k: r.seconds for k, r in best.items()}
        for r in swept:  # keep each graph's faster result: a probe launch or a swept one
            k = to_text(r.ugraph)
            spent[k] += r.seconds
            if r.error is None and r.median_us < best[k].median_us:
                best[k] = r
        return sorted((replace(r, seconds=spent[k]) for k, r in best.items()), key=lambda r: r.median_us)

    def refuse(self, key: tuple[str, Launch | None], why: str) -> None:
        """Never build or time the launch ``key`` (``profile.launch_key``): e.g. one that broke the CUDA
        context of an earlier process (``profile.ContextLost``)."""
        self._refused[key] = why

    def _prebuild(self, jobs: list, inputs: Sequence[torch.Tensor]) -> None:
        if self.workers <= 1 or len(jobs) <= 1 or self.device.type != "cuda":
            return
        if self._pool is None:
            self._pool = self._new_pool()
        specs = [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in inputs]
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        args = [(to_text(g), c, specs, index, self.pdl, self.in_place, self.ordered_sums) for g, c in jobs]
        self._pool, failed = map_isolating_crashes(self._pool, self._new_pool, _build_once, args)
        for i, why in failed.items():
            text, c = args[i][:2]
            self._refused[launch_key(text, c)] = f"the build or its one launch {why}"

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "Selector":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self._pool is not None:  # interrupted: do not wait for builds
            procs.kill_pool(self._pool)
            self._pool = None
        self.close()


class _StageClock:
    """Wall seconds of consecutive stages: where a pick's minutes go (builds in the workers, or timing here)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.laps[stage] = now - self._t
        self._t = now


def map_isolating_crashes(pool: ProcessPoolExecutor, new_pool: Callable[[], ProcessPoolExecutor],
                          fn: Callable, jobs: Sequence, stall_s: float | None = None
                          ) -> tuple[ProcessPoolExecutor, dict[int, str]]:
    """Run ``fn`` over ``jobs`` in ``pool``; returns the pool to use from now on and, by index, why each job that
    did not finish failed (``CRASHED``: it killed its worker process; ``STUCK``: alone, it ran past ``stall_s``,
    default ``BUILD_STALL_S``). When a worker dies the pool breaks and every job not yet finished fails with it;
    when no job finishes for ``stall_s`` the pool is killed. Either way the unfinished jobs are run again one at a
    time, each in a fresh pool after a failure, so only a job that fails on its own is blamed. An exception here
    (KeyboardInterrupt included) kills the workers and the compilers they started before it propagates, rather
    than leaving them building."""
    stall_s = BUILD_STALL_S if stall_s is None else stall_s
    try:
        futures = [pool.submit(fn, job) for job in jobs]
        unfinished = procs.wait_unstalled(futures, stall_s)
        for i, f in enumerate(futures):
            if i not in unfinished and isinstance(f.exception(), BrokenProcessPool):
                unfinished.add(i)
        failed: dict[int, str] = {}
        broken = bool(unfinished)
        for i in sorted(unfinished):
            if broken:
                procs.kill_pool(pool)   # a stuck worker would never let a plain shutdown return
                pool, broken = new_pool(), False
            alone = pool.submit(fn, jobs[i])
            if procs.wait_unstalled([alone], stall_s):
                failed[i], broken = STUCK.format(stall_s), True
            elif isinstance(alone.exception(), BrokenProcessPool):
                failed[i], broken = CRASHED, True
        if broken:
            procs.kill_pool(pool)
            pool = new_pool()
        return pool, failed
    except BaseException:
        procs.kill_pool(pool)  # the pool in use now (a crash may have replaced the one passed in)
        raise


def _example(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A worker's input: random floats; integers are zeros, a valid index into any dim (a cache write's
    position: random ones went negative and tripped a device-side assert, which kills the worker's CUDA
    context, so every later build in it failed and the parent compiled those candidates itself)."""
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


BROKEN_CONTEXT_EXIT = 70  # a worker's exit status after a launch broke its CUDA context


def _build_once(job) -> str | None:
    """Worker: build ``graph`` at ``config`` and run it on random inputs as the timing pass will
    (``time_call``: back-to-back eager calls over rotated input sets, where launches chained with PDL
    overlap, then a CUDA-graph capture and replay); the error, if any. A launch that leaves this
    process's CUDA context unusable ends the process (``os._exit``): the pool breaks,
    ``map_isolating_crashes`` blames this job alone, and the parent refuses the launch instead of
    running it in its own context."""
    text, config, specs, device_index, pdl, in_place, ordered_sums = job
    device = torch.device("cuda", device_index)
    try:
        g = from_text(text)
        xs = [_example(shape, getattr(torch, dtype), device) for shape, dtype in specs]
        launch = None if config is None else {k.name: config for k in render_triton(g).kernels}
        cg = compile_graph(g, device=device, launch=launch, pdl=pdl, in_place=in_place, ordered_sums=ordered_sums)
        with torch.cuda.device(device):
            time_call(cg, rotated_sets(xs), graph=True, reps=1, warmup=1)
        return None
    except Exception as e:  # the timing pass in the parent reports it
        if not context_alive(device):
            os._exit(BROKEN_CONTEXT_EXIT)
        return f"{type(e).__name__}: {e}"
