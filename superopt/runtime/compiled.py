"""A μGraph compiled for one device: kernels built once, buffers preallocated, calls capturable.

``compile_graph(ugraph)`` renders and builds every customized op and allocates, once, a buffer
for every value the graph computes (outputs, intermediates, float32 workspaces of cross-block
sums and their counters, constants). A call then only launches work on the current torch stream: no host sync, no
device allocation, so a caller can capture it in a CUDA graph. The returned outputs are the
pool's buffers, overwritten by the next call (pass ``out=`` to write elsewhere).

On a CUDA device every kernel is compiled (or loaded from Triton's cache) when the graph is built,
not on its first call: ``compiles`` then counts the kernels Triton really compiled in this process
(misses in its cache), and ``binaries()`` returns their cubins and metadata as plain files, which a
later build takes back (``binaries=``) to compile nothing (``superopt.runtime.binaries``).

``in_place`` names inputs the caller lets the graph write: a library ``scatter`` into one of them
(a KV-cache write) updates that tensor itself, and the scatter's value is that input, so a decode
step neither copies its cache nor holds a second one (the input may have no other reader). Where
the written row is a kernel's output, that kernel stores it at the slot itself and the scatter
launches nothing (``codegen.store_through``).

``counter`` names the input a caller's int64 call counter may be (a KV cache's device-side length, which is also
the position its writes go to): every call then takes that counter (``count=``, or the bound call's last
argument) and adds one to it after the graph's work, in its last kernel where that is legal (``codegen.counted``),
else as one more launch.

The Python module that runs is always the one rendered here from the μGraph: no caller can hand
in source text to execute instead (a cache stores none; see docs/architecture.md, "Cache trust").
Stored binaries are matched to it by Triton's own hash of the rendered source, so a binary built
from other code is simply not found, and compiled afresh.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Callable, Sequence

import torch

from ..codegen.launch import Launch, ordered_sums, prefetched
from ..codegen.triton import KernelSpec, render_built, render_triton
from ..ir import KernelGraph, check
from ..ir.graph import VIEW_OPS
from . import binaries as _binaries
from .build import kernel_op, load_module
from .dtypes import TORCH_DTYPES
from .interpreter import interpreting
from .fast_launch import direct_launches
from .grid_dependency import applies
from .library import library_fn, run_library, scatter_in_place, view

_VIEWS = ("reshape", "transpose", "slice")

# Set by ``recording()``: every call of a compiled graph (plain or bound) appends (graph, its inputs) here.
_recording: list | None = None


@contextlib.contextmanager
def recording():
    """Collect the calls of every compiled graph made inside, in order, as ``[(compiled_graph, inputs), ...]``
    (the calls still run). What a decode step launches, for a tool that runs those kernels another way
    (``runtime.persistent``); off, a call pays one global read."""
    global _recording
    outer, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = outer


def mark(what: str) -> None:
    """While ``recording()``: other GPU work runs here (``what``, e.g. the decode attention's kernels), which the
    recording cannot hand over; it appears as ``(None, what)`` between the calls (``runtime.persistent.segments``)."""
    if _recording is not None:
        _recording.append((None, what))


class CompiledGraph:
    """Callable: ``compiled(*inputs, out=None, count=None) -> list[Tensor]`` (inputs in ``ugraph.inputs`` order;
    ``count``: the call counter, with ``counter``)."""

    def __init__(self, ugraph: KernelGraph, device: str | torch.device = "cuda",
                 launch: dict[str, Launch] | None = None, cache_dir=None,
                 binaries: dict[str, bytes] | None = None, pdl: bool = True, in_place: Sequence[str] = (),
                 counter: str | None = None, ordered_sums: bool = False):
        self.graph = check(ugraph)
        self.in_place = _in_place_scatters(self.graph, in_place)  # node index -> the input it writes
        self.device = torch.device(device)
        launch = {k: Launch.of(v) for k, v in (launch or {}).items()}
        # on sm_90+ (and ``pdl``) every kernel waits for its predecessor and lets its successor be
        # scheduled early: rendered so, launched so (grid_dependency). The source is always rendered
        # here from the μGraph, never taken from a cache; ``binaries`` (a signed cache entry's) only
        # seed Triton's cache, which uses them where their hash matches this source.
        self.pdl = applies(self.device, pdl)
        self.module, launch = render_built(ugraph, launch, ordered_sums, pdl=self.pdl,
                                           in_place=frozenset(self.in_place.values()), counted=counter)
        # the call counter: advanced by this node's kernel (``codegen.counted``), or by an add after the graph
        self.counter, self.counting = counter, self.module.counting
        # scatters a kernel stores (store_through): their rows get no buffer, the scatters no launch
        self.stored = {s.scatter for s in self.module.stored}
        self.written = frozenset(s.cache for s in self.module.stored)  # inputs a kernel writes at offsets
        rows = {ugraph.nodes[s.scatter].args[2] for s in self.module.stored}
        self.compiles = 0   # kernels Triton compiled for this graph in this process (cache misses)
        self.loaded = 0     # kernels Triton loaded from its cache instead
        self._hashes: dict[str, str] = {}
        if self.device.type == "cpu" and self.module.kernels and not interpreting():
            raise RuntimeError("compile_graph: Triton kernels run on a CPU device only in its interpreter; set "
                               "TRITON_INTERPRET=1 before triton is imported")
        # what each kernel runs with (and what a cache entry stores): the given launch, or the
        # renderer's default, with ``chain`` as rendered (``ir.chain`` may find no legal consumer)
        self.launch = {s.name: dataclasses.replace(launch.get(s.name, Launch(s.num_warps, s.num_stages)),
                                                   chain=s.tail >= 0) for s in self.module.kernels}
        # per kernel: (custom op, spec, launch)
        self.kernels = {s.node_index: (kernel_op(self.module, s, cache_dir), s, self.launch[s.name])
                        for s in self.module.kernels}
        # nodes whose work a chained kernel does (``ir.chain``): never launched themselves
        self.tails = {s.tail for s in self.module.kernels if s.tail >= 0}
        if self.device.type == "cuda" and self.module.kernels and not interpreting():
            self._warm(cache_dir, binaries)
        self.pool: dict[str, torch.Tensor] = {}
        self.workspace: dict[tuple[int, int], torch.Tensor] = {}
        self.staging: dict[tuple[int, int], torch.Tensor] = {}  # contiguous copies of strided kernel args
        self.sums: dict[int, _Summed] = {}  # per customized node with cross-block sums in workspaces
        for idx, n in enumerate(ugraph.nodes):
            if n.op in _VIEWS:
                continue
            if n.op == "const":
                self.pool[n.out.name] = torch.full((), float(n.attr("value")),
                                                   dtype=TORCH_DTYPES[n.attr("dtype")], device=self.device)
                continue
            if idx in self.in_place:  # its value is the input it writes: no buffer
                continue
            for v in n.outs:
                if v.name not in rows:
                    self.pool[v.name] = torch.empty(v.type.shape, dtype=TORCH_DTYPES[v.type.dtype],
                                                    device=self.device)
            if idx in self.kernels and self.kernels[idx][1].counters:
                self.sums[idx] = self._summed(idx, n)

    def _summed(self, idx: int, n) -> "_Summed":
        """Node ``idx``'s float32 workspaces of cross-block sums, as views of one zeroed buffer, and
        its zeroed counters: its kernel leaves both zero after every launch (``KernelSpec``)."""
        spec = self.kernels[idx][1]
        sizes = [spec.workspace_elements(i, math.prod(n.outs[j].type.shape)) for i, j in enumerate(spec.workspaces)]
        # every view starts 16-byte aligned (offsets in multiples of 8 elements), as Triton's
        # stored kernels were specialised for: a misaligned pointer would need another compile
        starts = [sum(-(-size // 8) * 8 for size in sizes[:i]) for i in range(len(sizes))]
        ws = torch.zeros(starts[-1] + sizes[-1] if sizes else 0, dtype=torch.float32, device=self.device)
        for j, at, size in zip(spec.workspaces, starts, sizes):
            shape = n.outs[j].type.shape
            view = ws[at:at + size]   # ordered sums (``Launch.ordered``): a slot of the output's shape a part
            self.workspace[(idx, j)] = view.view(shape) if size == math.prod(shape) else view.view(-1, *shape)
        return _Summed(ws, torch.zeros(spec.counters, dtype=torch.int32, device=self.device))

    def finish_args(self, idx: int) -> list[torch.Tensor]:
        """What node ``idx``'s kernel takes after its outputs (``KernelSpec.params``): the workspaces
        of its cross-block sums and its counters, if it has any."""
        spec = self.kernels[idx][1]
        if not spec.counters:
            return []
        return [self.workspace[(idx, j)] for j in spec.workspaces] + [self.sums[idx].counter]

    @functools.cached_property
    def blocks(self):
        """This graph's kernels as device functions of their block index (``render_triton(blocks=True)``, the
        prefetch marks of ``launch`` kept), rendered once: what ``kernel_launches`` hands over."""
        return render_triton(self.graph, prefetched(self.launch), blocks=True, ordered=ordered_sums(self.launch))

    def kernel_launches(self, *inputs: torch.Tensor) -> tuple[list[tuple[KernelSpec, list[torch.Tensor]]],
                                                              list[torch.Tensor]]:
        """What a call on ``inputs`` runs, launching nothing: per kernel in graph order its spec in ``blocks`` and
        the tensors it takes (``KernelSpec.params`` order; outputs are the pool's buffers), then the graph's
        outputs. A chained kernel's consumer (``ir.chain``) is its own kernel here. For a caller that runs the
        kernels another way (``runtime.persistent``), so only for graphs of kernels, views and constants (no library
        op, call counter or in-place write) whose kernels get contiguous arguments (no staging copy)."""
        g = self.graph
        self._check_inputs(inputs)
        if self.counter is not None or self.in_place:
            raise ValueError(f"{g.name}: kernel_launches hands over plain kernels only: this graph has a call "
                             f"counter or an in-place write")
        specs = {s.node_index: s for s in self.blocks.kernels}
        env: dict[str, torch.Tensor] = dict(zip((v.name for v in g.inputs), inputs))
        launches = []
        for idx, n in enumerate(g.nodes):
            if n.op in _VIEWS:
                env[n.out.name] = view(n, env[n.args[0]])
            elif n.op == "const":
                env[n.out.name] = self.pool[n.out.name]
            elif n.op == "customized":
                spec = specs[idx]
                args = [env[a] for a in spec.args]
                strided = [a for a, t in zip(spec.args, args) if not t.is_contiguous()]
                if strided:
                    raise ValueError(f"{g.name}: kernel {spec.name} would read %{strided[0]} through a staging copy "
                                     f"(not contiguous), which kernel_launches cannot hand over")
                if spec.counters and idx not in self.sums:  # a chained consumer's own sums: never allocated
                    raise ValueError(f"{g.name}: kernel {spec.name} sums across blocks but ran chained, so it has "
                                     f"no workspace of its own to hand over")
                outs = [self.pool[v] for v in spec.outs]
                # (a chained producer's counters include its chain's groups: more than its plain kernel counts)
                launches.append((spec, args + outs + (self.finish_args(idx) if spec.counters else [])))
                env.update(zip(spec.outs, outs))
            else:
                raise ValueError(f"{g.name}: node {idx} is a library op ({n.op}), which runs as torch, not as a "
                                 f"kernel kernel_launches can hand over")
        return launches, [env[o] for o in g.outputs]

    def _warm(self, cache_dir, files: dict[str, bytes] | None) -> None:
        """Compile or load every kernel now (no launch), after seeding Triton's cache with ``files``."""
        log = _binaries.warm(self.module, load_module(self.module, cache_dir), self.launch, self.device, files,
                             self.graph.name)
        self.compiles, self.loaded, self._hashes = len(log.compiled), len(log.loaded), dict(log.hashes)

    @property
    def launches(self) -> int:
        """Launches a call makes: kernels (a chain's consumer runs in its producer's) and library ops, less
        views, constants and the scatters a kernel stores (``codegen.store_through``); with the call counter's add
        where no kernel counts (``codegen.counted``)."""
        return sum(n.op not in VIEW_OPS and i not in self.tails and i not in self.stored
                   for i, n in enumerate(self.graph.nodes)) + (self.counter is not None and self.counting is None)

    @property
    def source(self) -> str:
        """The generated Triton module source of this graph, as rendered and built."""
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

    def _check_inputs(self, inputs: Sequence[torch.Tensor | None]) -> None:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"{g.name}: expected {len(g.inputs)} inputs ({', '.join(v.name for v in g.inputs)}), "
                            f"got {len(inputs)}")
        for v, t in zip(g.inputs, inputs):
            if t is not None and (tuple(t.shape) != v.type.shape or t.dtype != TORCH_DTYPES[v.type.dtype]):
                raise ValueError(f"{g.name}: input %{v.name} is {t.dtype}{list(t.shape)}, expected "
                                 f"{v.type.dtype}{list(v.type.shape)}")
            if t is not None and v.name in self.written and not t.is_contiguous():
                raise ValueError(f"{g.name}: input %{v.name} is written in place by a kernel and must be "
                                 f"contiguous (strides {t.stride()}); allocate it contiguous, as a copy "
                                 f"would take the write")

    def __call__(self, *inputs: torch.Tensor, out: Sequence[torch.Tensor] | None = None,
                 count: torch.Tensor | None = None) -> list[torch.Tensor]:
        g = self.graph
        self._check_inputs(inputs)
        if _recording is not None:
            _recording.append((self, list(inputs)))
        if (count is None) != (self.counter is None):
            raise TypeError(f"{g.name}: built with counter={self.counter!r}, so a call "
                            + ("takes the counter as count=" if count is None else "takes no count="))
        env: dict[str, torch.Tensor] = dict(zip((v.name for v in g.inputs), inputs))
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
            elif idx in self.tails:  # its kernel ran inside its producer's launch (ir.chain)
                continue
            elif idx in self.in_place:
                if idx not in self.stored:  # else its producer's kernel wrote the slot
                    scatter_in_place(n)(*[env[a] for a in n.args])
                env[n.out.name] = env[n.args[0]]
            elif n.op == "customized":
                op, spec, launch = self.kernels[idx]
                args = [self._arg(idx, j, env[a]) for j, a in enumerate(spec.args)]
                outs = [env[v] if v in env else targets[v] for v in spec.outs]  # an input: a stored-through cache
                counts = [count] if spec.counts else []
                op(*args, *outs, *self.finish_args(idx), *counts, launch.num_warps, launch.num_stages)
                env.update(zip(spec.outs, outs))
            else:
                run_library(n, [env[a] for a in n.args], targets[n.out.name])
                env[n.out.name] = targets[n.out.name]
        if count is not None and self.counting is None:
            count.add_(1)
        for name, t in direct.items():
            t.copy_(env[name])
            env[name] = t
        return [env[o] for o in g.outputs]

    def bind(self, fixed: Sequence[torch.Tensor | None]) -> Callable[..., list[torch.Tensor]]:
        """A thinner call for a caller that passes the same tensors for some inputs on every call
        (a layer's weights): ``fixed[i]`` is input i's tensor, or None for an input given per call;
        the result takes the per-call inputs, in order (then the call counter, with ``counter``), and returns what
        ``__call__`` returns.

        Without CUDA graphs a decode step pays this call's host time once per site per layer, so
        the work that does not change between calls is done here, once: shapes and dtypes of the
        fixed inputs are checked, every value gets a slot in a flat list whose fixed entries
        (fixed inputs, pool buffers and views of them) are filled now, and each node becomes one
        step over that list. The per-call inputs are not checked: the caller guarantees their
        shapes and dtypes (``__call__`` checks them). Kernels are launched directly (one switch of
        ``wrap_triton`` per call, not per kernel); while ``torch.compile`` traces, the call goes
        through ``__call__`` and the kernels' custom ops instead.
        """
        self._check_inputs(fixed)
        g = self.graph
        plan = _Plan()
        given = [plan.add(v.name, t) for v, t in zip(g.inputs, fixed) if t is None]
        for v, t in zip(g.inputs, fixed):
            if t is not None:
                plan.add(v.name, t)
        counted = [] if self.counter is None else [len(plan.values)]  # the counter's slot, given per call
        if counted:
            plan.values.append(None)
            given += counted
        for idx, n in enumerate(g.nodes):
            if n.op in _VIEWS:
                src = plan.fixed_value(n.args[0])
                if src is not None:   # a view of a fixed input or a pool buffer: taken once
                    plan.add(n.out.name, view(n, src))
                else:
                    plan.steps.append(functools.partial(_view_step, n, plan.slot[n.args[0]], plan.add(n.out.name)))
            elif n.op == "const":
                plan.add(n.out.name, self.pool[n.out.name])
            elif idx in self.tails:  # its outputs are slots of its producer's step
                continue
            elif idx in self.in_place:  # its value is the slot of the input it writes
                plan.slot[n.out.name] = plan.slot[n.args[0]]
                if idx not in self.stored:  # else its producer's kernel wrote the slot
                    plan.steps.append(functools.partial(_library_step, scatter_in_place(n),
                                                        [plan.slot[a] for a in n.args]))
            elif n.op == "customized":
                op, spec, launch = self.kernels[idx]
                args = [plan.slot[a] for a in spec.args]
                staged = [functools.partial(self._arg, idx, j) for j in range(len(spec.args))]
                if spec.counts or any(v in plan.slot for v in spec.outs):  # it writes a per-call tensor
                    outs = [plan.slot[v] if v in plan.slot else plan.add(v, self.pool[v]) for v in spec.outs]
                    plan.steps.append(functools.partial(_kernel_into_step, op.launch, args, staged, outs,
                                                        self.finish_args(idx), counted if spec.counts else [],
                                                        launch.num_warps, launch.num_stages))
                    continue
                for v in spec.outs:
                    plan.add(v, self.pool[v])
                tail = [self.pool[v] for v in spec.outs] + self.finish_args(idx)
                plan.steps.append(functools.partial(_kernel_step, op.launch, args, staged, tail,
                                                    launch.num_warps, launch.num_stages))
            else:
                plan.add(n.out.name, self.pool[n.out.name])
                plan.steps.append(functools.partial(_library_step, library_fn(n, self.pool[n.out.name]),
                                                    [plan.slot[a] for a in n.args]))
        if counted and self.counting is None:
            plan.steps.append(functools.partial(_library_step, _advance, counted))
        outputs = [plan.slot[o] for o in g.outputs]
        start, steps = plan.values, plan.steps
        merged = list(fixed)
        holes = [i for i, t in enumerate(fixed) if t is None]

        def call(*xs: torch.Tensor) -> list[torch.Tensor]:
            if torch.compiler.is_compiling():
                for i, x in zip(holes, xs):
                    merged[i] = x
                return self(*merged, count=xs[-1] if counted else None)
            if _recording is not None:
                for i, x in zip(holes, xs):
                    merged[i] = x
                _recording.append((self, list(merged)))
            env = start.copy()
            for i, x in zip(given, xs):
                env[i] = x
            with direct_launches():
                for step in steps:
                    step(env)
            return [env[i] for i in outputs]
        return call


@dataclasses.dataclass(frozen=True)
class _Summed:
    """A kernel's cross-block sums: the buffer its float32 workspaces are views of, its counters."""

    ws: torch.Tensor
    counter: torch.Tensor


class _Plan:
    """Slots of a bound call: value name -> index into a flat list (``CompiledGraph.bind``)."""

    def __init__(self):
        self.slot: dict[str, int] = {}
        self.values: list = []   # per slot: the tensor when it is the same on every call, else None
        self.steps: list[Callable[[list], None]] = []

    def add(self, name: str, fixed: torch.Tensor | None = None) -> int:
        self.slot[name] = len(self.values)
        self.values.append(fixed)
        return self.slot[name]

    def fixed_value(self, name: str) -> torch.Tensor | None:
        return self.values[self.slot[name]]


def _view_step(n, src: int, dst: int, env: list) -> None:
    env[dst] = view(n, env[src])


def _kernel_step(launch, args: list[int], staged: list, tail: list, nw: int, ns: int, env: list) -> None:
    # a strided argument (a view of a per-call input) is copied to a contiguous staging buffer
    launch(*[t if t.is_contiguous() else stage(t) for t, stage in zip([env[i] for i in args], staged)],
           *tail, nw, ns)


def _kernel_into_step(launch, args: list[int], staged: list, outs: list[int], finish: list, counts: list[int],
                      nw: int, ns: int, env: list) -> None:
    # a kernel that also writes a per-call tensor: an input it stores a cache row into (``codegen.store_through``),
    # the call counter it advances (``codegen.counted``)
    launch(*[t if t.is_contiguous() else stage(t) for t, stage in zip([env[i] for i in args], staged)],
           *[env[i] for i in outs], *finish, *[env[i] for i in counts], nw, ns)


def _advance(count: torch.Tensor) -> None:
    count.add_(1)


def _library_step(fn, args: list[int], env: list) -> None:
    fn(*[env[i] for i in args])


def compile_graph(ugraph: KernelGraph, backend: str = "triton", device: str | torch.device = "cuda",
                  launch: dict[str, Launch] | None = None, cache_dir=None,
                  binaries: dict[str, bytes] | None = None, pdl: bool = True,
                  in_place: Sequence[str] = (), counter: str | None = None,
                  ordered_sums: bool = False) -> CompiledGraph:
    """Build ``ugraph`` for ``device``; ``launch`` maps kernel names to ``Launch`` (or its stored
    list form). ``binaries``: a trusted cache entry's ``CompiledGraph.binaries()`` (the source is
    always rendered from ``ugraph``). ``pdl``: programmatic dependent launch where the GPU has it.
    ``in_place``: inputs a library scatter may write; ``counter``: the input a call counter may be (see the
    module docstring). ``ordered_sums``: every kernel that sums across blocks does so in a fixed order
    (``Launch.ordered``), so a call's outputs are bitwise the same on every launch."""
    if backend != "triton":
        raise NotImplementedError(f"compile_graph: backend {backend!r}; this runtime builds 'triton' only")
    return CompiledGraph(ugraph, device, launch, cache_dir, binaries, pdl, in_place, counter, ordered_sums)


def _in_place_scatters(g: KernelGraph, names: Sequence[str]) -> dict[int, str]:
    """Node index -> input name, for each library scatter that writes one of the ``names`` inputs;
    raises ValueError where that cannot be done without changing what the graph computes."""
    if not names:
        return {}
    inputs = {v.name for v in g.inputs}
    if not set(names) <= inputs:
        raise ValueError(f"{g.name}: in_place names {sorted(set(names) - inputs)}, which are not inputs")
    out = {}
    for name in names:
        readers = [(i, n) for i, n in enumerate(g.nodes) if name in n.args]
        if len(readers) != 1 or readers[0][1].op != "scatter" or readers[0][1].args[0] != name \
                or name in g.outputs:
            raise ValueError(f"{g.name}: input %{name} is written in place only where a library scatter is its "
                             f"one reader; its readers: {[n.op for _, n in readers]}")
        out[readers[0][0]] = name
    return out
