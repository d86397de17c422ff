"""Two instances of one compiled μGraph launched as one: each kernel once, over twice the grid.

A decoder layer's k_proj and v_proj are the same program (RMSNorm + a projection of the same shape)
with different weights, run on the same activations. As two launches each pays the fixed cost of a
launch and of a grid too small to fill the GPU (a few µs for a few MB of weights on an H200); as one
launch of the paired rendering (``render_triton(paired=True)``) the second instance's programs run
beside the first's. ``PairedGraph(a, b)`` takes the two instances' ``CompiledGraph``s (their buffers
and workspaces are used as they are) and launches the paired kernels in their place; whether that
is faster is for the caller to measure (``time_paired``), as with any launch configuration. Its
``binaries()``, given back as ``PairedGraph(a, b, binaries)``, let a later process load the paired
kernels instead of compiling them.
"""
from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch

from ..codegen.launch import ordered_sums, prefetched
from ..codegen.triton import render_triton
from ..ir import digest
from . import binaries as _binaries
from .build import load_module
from .interpreter import interpreting
from .compiled import _VIEWS, CompiledGraph
from .fast_launch import direct_launches
from .library import run_library, view


class PairedGraph:
    """``bind(fixed_a, fixed_b)(*xs) -> outputs of a + outputs of b``: both instances on the same
    per-call inputs ``xs`` (``CompiledGraph.bind``'s convention), each with its own fixed inputs."""

    def __init__(self, a: CompiledGraph, b: CompiledGraph, binaries: dict[str, bytes] | None = None):
        if a is b or digest(a.graph) != digest(b.graph) or a.launch != b.launch or a.device != b.device:
            raise ValueError("PairedGraph: two distinct builds of one μGraph with one launch configuration")
        if a.tails:  # the paired rendering launches every customized op on its own
            raise ValueError("PairedGraph: a build whose kernel runs its consumer (ir.chain) is not paired")
        self.a, self.b = a, b
        # with programmatic dependent launch where the instances have it
        module = render_triton(a.graph, prefetched(a.launch), paired=True, pdl=a.pdl, ordered=ordered_sums(a.launch))
        self.module = module
        mod = load_module(module)
        self.launchers = {s.node_index: getattr(mod, s.launcher) for s in module.kernels}
        self.compiles = 0
        self._hashes: dict[str, str] = {}
        if a.device.type == "cuda" and module.kernels and not interpreting():
            log = _binaries.warm(module, mod, a.launch, a.device, binaries, f"{a.graph.name} paired")
            self.compiles, self._hashes = len(log.compiled), dict(log.hashes)

    def binaries(self) -> dict[str, bytes]:
        """The paired kernels as plain files for a cache entry (``CompiledGraph.binaries``'s form)."""
        return _binaries.export_files(self._hashes) if self._hashes else {}

    def bind(self, fixed_a: Sequence[torch.Tensor | None], fixed_b: Sequence[torch.Tensor | None]
             ) -> Callable[..., list[torch.Tensor]]:
        g = self.a.graph
        holes = [i for i, t in enumerate(fixed_a) if t is None]
        if holes != [i for i, t in enumerate(fixed_b) if t is None]:
            raise ValueError("PairedGraph.bind: both instances take the same per-call inputs")
        alone_a, alone_b = self.a.bind(fixed_a), self.b.bind(fixed_b)  # for torch.compile's tracing
        names = [v.name for v in g.inputs]

        def call(*xs: torch.Tensor) -> list[torch.Tensor]:
            if torch.compiler.is_compiling():  # the instances' custom ops, one after the other
                return alone_a(*xs) + alone_b(*xs)
            envs = []
            for fixed in (fixed_a, fixed_b):
                env = dict(zip(names, fixed))
                env.update((names[i], x) for i, x in zip(holes, xs))
                envs.append(env)
            with direct_launches():
                self._run(envs)
            return [envs[0][o] for o in g.outputs] + [envs[1][o] for o in g.outputs]
        return call

    def _run(self, envs: list[dict]) -> None:
        cgs = (self.a, self.b)
        for idx, n in enumerate(self.a.graph.nodes):
            if n.op in _VIEWS:
                for env in envs:
                    env[n.out.name] = view(n, env[n.args[0]])
            elif n.op == "const":
                for cg, env in zip(cgs, envs):
                    env[n.out.name] = cg.pool[n.out.name]
            elif n.op == "customized":
                _, spec, launch = self.a.kernels[idx]
                tensors = []
                for cg, env in zip(cgs, envs):
                    tensors += [cg._arg(idx, j, env[x]) for j, x in enumerate(n.args)]
                    tensors += [cg.pool[v.name] for v in n.outs] + cg.finish_args(idx)
                self.launchers[idx](*tensors, launch.num_warps, launch.num_stages)
                for cg, env in zip(cgs, envs):
                    env.update((v.name, cg.pool[v.name]) for v in n.outs)
            else:
                for cg, env in zip(cgs, envs):
                    run_library(n, [env[x] for x in n.args], cg.pool[n.out.name])
                    env[n.out.name] = cg.pool[n.out.name]


def time_paired(paired: Sequence[Callable], alone: Sequence[Sequence[Callable]], xs: Sequence[torch.Tensor],
                replays: int = 20) -> tuple[float, float]:
    """(µs per paired call, µs per pair of separate calls) on the GPU, as a decode step runs them:
    each variant captured in a CUDA graph that calls it once per weight copy (``paired[i]`` and
    ``alone[i]`` bound to copy i: enough copies that the weights are not served from L2), the
    graphs replayed alternately, each replay timed with CUDA events; medians."""
    def graph(fns) -> torch.cuda.CUDAGraph:
        for f in fns:  # first calls outside the capture: launch binding, kernel lookup
            f(*xs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f(*xs)
        return g

    def once(g: torch.cuda.CUDAGraph) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / len(paired)

    gp, ga = graph(list(paired)), graph([f for pair in alone for f in pair])
    both = [(once(gp), once(ga)) for _ in range(replays)]
    return statistics.median(p for p, _ in both), statistics.median(s for _, s in both)
