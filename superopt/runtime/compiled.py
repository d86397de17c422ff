"""A μGraph compiled for one device: kernels built once, buffers preallocated, calls capturable.

``compile_graph(ugraph)`` renders and builds every customized op and allocates, once, a buffer
for every value the graph computes (outputs, intermediates, float32 workspaces of cross-block
sums, constants). A call then only launches work on the current torch stream: no host sync, no
device allocation, so a caller can capture it in a CUDA graph. The returned outputs are the
pool's buffers, overwritten by the next call (pass ``out=`` to write elsewhere).

On a CUDA device every kernel is compiled (or loaded from Triton's cache) when the graph is built,
not on its first call: ``compiles`` then counts the kernels Triton really compiled in this process
(misses in its cache), and ``binaries()`` returns their cubins and metadata as plain files, which a
later build takes back (``binaries=``) to compile nothing (``superopt.runtime.binaries``).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Sequence

import torch

from ..codegen.triton import render_triton
from ..ir import KernelGraph, check
from . import binaries as _binaries
from .build import interpreting, kernel_op, load_module
from .library import run_library, view

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
_VIEWS = ("reshape", "transpose", "slice")


class CompiledGraph:
    """Callable: ``compiled(*inputs, out=None) -> list[Tensor]`` (inputs in ``ugraph.inputs`` order)."""

    def __init__(self, ugraph: KernelGraph, device: str | torch.device = "cuda",
                 launch: dict[str, tuple[int, int]] | None = None, cache_dir=None,
                 source: str | None = None, binaries: dict[str, bytes] | None = None):
        self.graph = check(ugraph)
        self.device = torch.device(device)
        self.module = render_triton(ugraph)
        if source is not None and source != self.module.source:
            # A cache entry's source (hash-checked by the cache) is what its binaries were built
            # from; the kernel specs still come from rendering (pure, milliseconds).
            self.module = dataclasses.replace(self.module, source=source)
        launch = launch or {}
        self.compiles = 0   # kernels Triton compiled for this graph in this process (cache misses)
        self.loaded = 0     # kernels Triton loaded from its cache instead
        self._hashes: dict[str, str] = {}
        # per kernel: (custom op, spec, num_warps, num_stages)
        if self.device.type == "cpu" and self.module.kernels and not interpreting():
            raise RuntimeError("compile_graph: Triton kernels run on a CPU device only in its interpreter; set "
                               "TRITON_INTERPRET=1 before triton is imported")
        self.kernels = {s.node_index: (kernel_op(self.module, s, cache_dir), s,
                                       *launch.get(s.name, (s.num_warps, s.num_stages)))
                        for s in self.module.kernels}
        self.launch = {s.name: (nw, ns) for _, s, nw, ns in self.kernels.values()}
        if self.device.type == "cuda" and self.module.kernels and not interpreting():
            self._warm(cache_dir, binaries)
        self.pool: dict[str, torch.Tensor] = {}
        self.workspace: dict[tuple[int, int], torch.Tensor] = {}
        self.staging: dict[tuple[int, int], torch.Tensor] = {}  # contiguous copies of strided kernel args
        for idx, n in enumerate(ugraph.nodes):
            if n.op in _VIEWS:
                continue
            if n.op == "const":
                self.pool[n.out.name] = torch.full((), float(n.attr("value")),
                                                   dtype=TORCH_DTYPES[n.attr("dtype")], device=self.device)
                continue
            for v in n.outs:
                self.pool[v.name] = torch.empty(v.type.shape, dtype=TORCH_DTYPES[v.type.dtype], device=self.device)
            if n.op == "customized":
                for j in self.kernels[idx][1].workspaces:
                    self.workspace[(idx, j)] = torch.empty(n.outs[j].type.shape, dtype=torch.float32,
                                                           device=self.device)

    def _warm(self, cache_dir, files: dict[str, bytes] | None) -> None:
        """Compile or load every kernel now (no launch), after seeding Triton's cache with ``files``."""
        if files:
            try:
                _binaries.seed(files)
            except (_binaries.BadBinaries, OSError) as e:   # compile instead; never fail the build
                warnings.warn(f"{self.graph.name}: stored Triton binaries not used ({e})", stacklevel=3)
        with torch.cuda.device(self.device):
            log = _binaries.warmup(self.module, load_module(self.module, cache_dir), self.launch)
        self.compiles, self.loaded, self._hashes = len(log.compiled), len(log.loaded), dict(log.hashes)

    @property
    def source(self) -> str:
        """The generated Triton module source this graph runs."""
        return self.module.source

    def binaries(self) -> dict[str, bytes]:
        """The compiled kernels as plain files (``superopt.runtime.binaries.export_files``); empty
        where nothing was compiled here (CPU, interpreter, kernel-free graphs)."""
        return _binaries.export_files(self._hashes) if self._hashes else {}

    def _arg(self, idx: int, j: int, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return t
        buf = self.staging.get((idx, j))
        if buf is None:  # first call only: shapes and strides are static per graph
            buf = self.staging[(idx, j)] = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        buf.copy_(t)
        return buf

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"{g.name}: expected {len(g.inputs)} inputs ({', '.join(v.name for v in g.inputs)}), "
                            f"got {len(inputs)}")
        env: dict[str, torch.Tensor] = {}
        for v, t in zip(g.inputs, inputs):
            if tuple(t.shape) != v.type.shape or t.dtype != TORCH_DTYPES[v.type.dtype]:
                raise ValueError(f"{g.name}: input %{v.name} is {t.dtype}{list(t.shape)}, expected "
                                 f"{v.type.dtype}{list(v.type.shape)}")
            env[v.name] = t
        targets = dict(self.pool)
        direct = {}
        if out is not None:
            for name, t in zip(g.outputs, out):
                if name in targets and t.is_contiguous():
                    targets[name] = t
                else:
                    direct[name] = t
        for idx, n in enumerate(g.nodes):
            if n.op in _VIEWS:
                env[n.out.name] = view(n, env[n.args[0]])
            elif n.op == "const":
                env[n.out.name] = targets[n.out.name]
            elif n.op == "customized":
                op, spec, nw, ns = self.kernels[idx]
                args = [self._arg(idx, j, env[a]) for j, a in enumerate(n.args)]
                outs = [targets[v.name] for v in n.outs]
                wss = [self.workspace[(idx, j)] for j in spec.workspaces]
                op(*args, *outs, *wss, nw, ns)
                env.update((v.name, t) for v, t in zip(n.outs, outs))
            else:
                run_library(n, [env[a] for a in n.args], targets[n.out.name])
                env[n.out.name] = targets[n.out.name]
        for name, t in direct.items():
            t.copy_(env[name])
            env[name] = t
        return [env[o] for o in g.outputs]


def compile_graph(ugraph: KernelGraph, backend: str = "triton", device: str | torch.device = "cuda",
                  launch: dict[str, tuple[int, int]] | None = None, cache_dir=None,
                  source: str | None = None, binaries: dict[str, bytes] | None = None) -> CompiledGraph:
    """Build ``ugraph`` for ``device``; ``launch`` maps kernel names to (num_warps, num_stages).
    ``source`` / ``binaries``: a cache entry's generated source and ``CompiledGraph.binaries()``."""
    if backend != "triton":
        raise NotImplementedError(f"compile_graph: backend {backend!r}; this runtime builds 'triton' "
                                  f"(the CUDA backend lives in superopt.codegen.cuda*)")
    return CompiledGraph(ugraph, device, launch, cache_dir, source, binaries)
