"""Render a μGraph's customized ops to Triton: one ``@triton.jit`` kernel (+ launcher) per op.

The kernel of a block graph (ir/graph.py) is the block graph itself, written out: one Triton
program per threadblock of the ``grid``; loop-invariant nodes before a ``for`` over the
``forloop`` range; inside it the fmap'd tile loads, the loop-variant nodes and the accumulators
in graph order (as ``interp.evaluate`` runs them); after it the nodes that read final values;
then one masked store per output, an atomic add where blocks must be summed (``reduce sum``).
Blocks summed into one output tile finish the sum themselves (``BlockWriter.finish_sums``): each adds its
part into a float32 workspace and counts itself in; the last one of its tile reads the sum back,
resets the workspace and the counter to zero, and stores the sum in the output's dtype — one
launch, where a zeroing before and a cast after would be two more; or, as the launch variant ``ordered``, each
stores its part in a slot of its own and the last one adds the slots in order, the same bits on every launch
where atomic adds follow the blocks' timing. As a launch variant a
kernel can also run its consumer's blocks in its last block of each group (``ir.chain``,
``_emit_chained``): a split kernel and its combine in one launch. The lines of each block graph
are written by a ``triton_block.BlockWriter``; this module lays out kernels, launchers and specs.

Numerics: tiles are loaded in their dtype and every op computes in float32; a matmul feeds
``tl.dot`` operands in the dtype the μGraph declares (tensor cores for fp16/bf16, exact IEEE
for fp32) and accumulates in float32; a ``cast`` to fp16/bf16 rounds through that dtype; stores
round to the output's dtype. Shapes, strides and offsets are baked in as constants (a μGraph is
static), which lets Triton prove alignment and issue 16-byte vector loads. Tiles are padded to
Triton's extents (``ir.padding``); masks keep padding out of reductions, dots and stores.

A decode GEMV's dot has few rows (M ≤ 16). Summed over the loop it is written transposed, (W·xᵀ)ᵀ, where the
weight tile has 64+ rows, so the weight rows fill a warpgroup MMA (``triton_block._swapped_accums``); two
such dots on one operand whose weight tiles have fewer rows each but 64+ together (a gated MLP's gate and up)
load the two tiles as one and run one dot (``triton_block._stacked_pairs``). A reduction accumulated over the loop
is summed elementwise and reduced once after it (``triton_block.deferred_sums``), also where the μGraph scales
each iteration's part by a loop-invariant value before accumulating it (``triton_block.scaled_sums``).

Library ops are not rendered: the runtime runs them as torch calls. This module imports no
triton and no torch; it only writes text.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from ..ir import (DTYPE_BYTES, BlockGraph, Category, KernelGraph, Node, Variance, block_variance, default_stages,
                  op_info, reduced_axes)
from ..ir.chain import Chain, chains
from .common import identifier
from .counted import counting_kernel
from .launch import Launch, Launches, rendering
from .store_through import StoreThrough, stores_through
from .triton_block import BlockWriter, deferred_sums, scaled_sums, tile_mask


@dataclass(frozen=True)
class KernelSpec:
    """One rendered kernel: which customized node it runs and how the runtime launches it."""

    name: str                  # the @triton.jit function
    launcher: str              # the python function that launches it (wrapped as a torch custom op)
    node_index: int            # position of the customized node in the kernel graph
    grid: tuple[int, int, int]
    args: tuple[str, ...]      # kernel-graph tensors read, in launcher order
    outs: tuple[str, ...]      # kernel-graph tensors written, in launcher order
    workspaces: tuple[int, ...]  # indices into ``outs`` that blocks sum (``BlockWriter.finish_sums``) in a
                                 # float32 workspace w{j}
    num_warps: int             # defaults: block_threads / 32, and the most stages (≤ 3) whose shared
    num_stages: int            # memory estimate (ir.smem) fits sm_90; the profiler may change them
    paired: bool = False       # two instances in one launch: every pointer twice, the second set's
                               # programs at 1 on a grid axis the μGraph leaves at 1 (``render_triton``)
    counters: int = 0          # int32 counters ``c`` of the blocks done per summed output tile, then
                               # per group of a chain; zero before the first launch, and every
                               # launch leaves them (and the workspaces) so
    tail: int = -1             # the consumer node this kernel also runs (``ir.chain``), or -1: then
                               # ``args`` / ``outs`` continue with the consumer's
    counts: bool = False       # also adds one to the caller's int64 call counter ``n`` (``codegen.counted``)
    parts: tuple[int, ...] = ()  # per workspace, the partial sums it holds side by side: its blocks' count where
                                 # the sums are ordered (``Launch.ordered``), else () (one, added to atomically)

    def workspace_elements(self, i: int, out_elements: int) -> int:
        """Float32 elements of the ``i``-th workspace, whose output has ``out_elements``."""
        return out_elements * (self.parts[i] if self.parts else 1)

    def params(self) -> list[str]:
        """The launcher's tensor parameters, in order (one instance's; ``paired`` takes them twice)."""
        ins = [f"a{j}" for j in range(len(self.args))]
        outs = [f"o{j}" for j in range(len(self.outs))]
        return (ins + outs + [f"w{j}" for j in self.workspaces] + (["c"] if self.counters else [])
                + (["n"] if self.counts else []))


def kernel_param_dtypes(spec: KernelSpec, g: KernelGraph) -> dict[str, str]:
    """The dtype of each pointer the kernel takes, by parameter name (``a0_ptr`` …), one instance's."""
    out = {f"a{j}_ptr": g.type_of(a).dtype for j, a in enumerate(spec.args)}
    out.update({f"o{j}_ptr": g.type_of(v).dtype for j, v in enumerate(spec.outs)})
    out.update({f"w{j}_ptr": "float32" for j in spec.workspaces})
    if spec.counters:
        out["c_ptr"] = "int32"
    if spec.counts:
        out["n_ptr"] = "int64"
    return out


@dataclass(frozen=True)
class TritonModule:
    name: str
    source: str
    kernels: list[KernelSpec]
    graph: KernelGraph
    pdl: bool = False  # every kernel waits for its predecessor first: launch it with ``launch_pdl``
    stored: tuple[StoreThrough, ...] = ()  # scatters their producer kernels store (``store_through``): not run
    counting: int | None = None  # the node whose kernel advances the caller's call counter (``counted``), if any


# Programmatic dependent launch (sm_90+, superopt.runtime.grid_dependency): a kernel rendered with
# ``pdl`` waits for its predecessor, then lets its successor be scheduled, before any load or store.
PDL_WAIT = "tl.extra.cuda.gdc_wait()"
PDL_SIGNAL = "tl.extra.cuda.gdc_launch_dependents()"
# Before that wait a block asks L2 for its first tile of each weight (``_weights_to_l2``): inputs of at least this
# many bytes (an activation of a decode step is smaller), at most this many bytes a block.
L2_PREFETCH_MIN = 256 << 10
L2_PREFETCH_CAP = 64 << 10
# Only a kernel of at most this many blocks asks: about two an SM of a 132-SM H100, so all of them can be resident
# during the predecessor's tail. Measured on an H100 (alternated runs; benchmarks/results/floor_h100_2026-11-28_s38):
# Llama-3.1-8B b8, whose site kernels have 128-256 blocks of 8-64 KB tiles, 1.9% faster a step; Llama-3.2-1B b1,
# 512-8192 blocks of 0.5-16 KB, 55% slower with every block asking (a small tile is held in copies by many threads,
# and each copy's request is one of its own) and still 1.8% slower with only the first 256 blocks asking.
L2_PREFETCH_BLOCKS = 256


def render_triton(ugraph: KernelGraph, prefetch: frozenset[str] = frozenset(), paired: bool = False,
                  chain: frozenset[str] = frozenset(), pdl: bool = False,
                  in_place: frozenset[str] = frozenset(), counted: str | None = None,
                  blocks: bool = False, ordered: frozenset[str] = frozenset()) -> TritonModule:
    """Render every customized op of ``ugraph``; library ops are left to the runtime.

    Kernels named in ``prefetch`` load the next iteration's tiles before this iteration's work
    (``_render_kernel``): a launch variant the profiler times like num_warps and num_stages.
    ``paired``: every kernel runs two instances of the graph in one launch (k_proj and v_proj of a
    layer: one program, two weights), taking each pointer twice (the second set suffixed ``_b``);
    the programs at 1 on a grid axis the μGraph does not use run the second instance, or, when
    every axis is cut, the upper half of a doubled x axis.
    ``chain``: kernels that also run their consumer, where ``ir.chain`` finds that legal (one
    launch for a split kernel and its combine); the consumer's kernel is then not rendered.
    Never with ``paired``. ``pdl``: every kernel waits for its predecessor and signals its successor
    before its first load or store (``PDL_WAIT``, ``PDL_SIGNAL``; why that order is safe next to any
    neighbour: ``superopt.runtime.grid_dependency``); before the wait, a kernel of few blocks asks L2 for its
    first weight tiles (``_weights_to_l2``). The module is then launched with dependent launch.
    ``in_place``: inputs the runtime lets the graph write; a scatter of a kernel's row into one of them is
    stored by that kernel where ``store_through`` finds it legal (``TritonModule.stored``). ``counted``: the graph
    input a caller's call counter may be; the last kernel advances the counter where ``counted.counting_kernel``
    finds it legal (``TritonModule.counting``; else the caller counts after the graph). Never with ``paired``.
    ``blocks``: every kernel as a device function of its block index, ``{name}_block(pid0, pid1, pid2, *params)``,
    with no launcher: the bodies a persistent kernel calls (``codegen.persistent``). Never with ``paired``,
    ``chain``, ``pdl``, ``in_place`` or ``counted``. ``ordered``: kernels whose cross-block sums are added in a
    fixed order (``BlockWriter.finish_sums``): bitwise the same on every launch, where atomic adds are not."""
    if blocks and (paired or chain or pdl or in_place or counted is not None):
        raise ValueError("render_triton(blocks=True) renders plain block bodies: no paired, chain, pdl, in_place or "
                         "counted variant")
    base = identifier(ugraph.name)
    parts = ["import torch", "import triton", "import triton.language as tl",
             "from torch.library import wrap_triton", ""]
    legal = {} if paired or not chain else chains(ugraph)
    runs = {idx: c for idx, c in legal.items() if f"{base}_k{idx}" in chain}
    consumed = {c.consumer for c in runs.values()}
    stored = () if paired or not in_place else stores_through(ugraph, in_place, frozenset(runs) | consumed)

    def render(idx: int, counts: bool = False) -> tuple[KernelSpec, str]:
        name = f"{base}_k{idx}"
        return _render_kernel(name, idx, ugraph.nodes[idx], ugraph, name in prefetch, paired, runs.get(idx), pdl,
                              [s for s in stored if s.kernel == idx], counts, blocks, name in ordered)
    rendered = {idx: render(idx) for idx, n in enumerate(ugraph.nodes) if n.op == "customized" and idx not in consumed}
    counting = None if paired or counted is None else \
        counting_kernel(ugraph, counted, {idx: spec.args for idx, (spec, _) in rendered.items()}, frozenset(consumed))
    if counting is not None:
        rendered[counting] = render(counting, counts=True)
    kernels = [spec for spec, _ in rendered.values()]
    parts += [text for _, text in rendered.values()]
    return TritonModule(base, "\n".join(parts), kernels, ugraph, pdl, stored, counting)


def render_built(ugraph: KernelGraph, launch: Launches | None, ordered_sums: bool = False,
                 **variants) -> tuple[TritonModule, Launches | None]:
    """The module a build renders for ``ugraph`` at ``launch`` (``render_triton``'s ``variants``: pdl, in_place,
    counted), and the launch it runs: with ``ordered_sums`` (``PatchOptions.deterministic``) every kernel that sums
    across blocks is rendered and marked ``ordered`` (``Launch.ordered``), the others as they were.
    ``compile_graph`` and the precompile of a cache hit both render through here, so the binary compiled ahead is
    the one the build loads."""
    module = render_triton(ugraph, **rendering(launch), **variants)
    if ordered_sums and any(s.workspaces and not s.parts for s in module.kernels):
        # every cross-block sum in a fixed order: the same inputs, the same bits, on every launch
        launch = {k: Launch.of(v) for k, v in (launch or {}).items()}
        for s in module.kernels:
            if s.workspaces:
                launch[s.name] = dataclasses.replace(launch.get(s.name, Launch(s.num_warps, s.num_stages)),
                                                     ordered=True)
        module = render_triton(ugraph, **rendering(launch), **variants)
    return module, launch


def _weights_to_l2(k: BlockWriter, node: Node, g: KernelGraph, written: frozenset[str]) -> None:
    """Before a dependent launch's wait: ask L2 for this block's first tile of each weight, so its first loads
    after the wait find them there while the predecessor's tail still runs (no load, no store: a hint).

    A weight is a graph input of at least ``L2_PREFETCH_MIN`` bytes that the graph does not write
    (``written``), read in place (no view); at most ``L2_PREFETCH_CAP`` bytes a block. Earlier forms asked for a
    block's even share of each weight's bytes, which for a tile of many rows is not its first tile
    (benchmarks/results/floor_h100_2026-11-28_s35/README.md)."""
    b: BlockGraph = node.block
    if math.prod(b.grid) > L2_PREFETCH_BLOCKS:
        return
    inputs = {v.name for v in g.inputs}
    budget = L2_PREFETCH_CAP
    for inp in b.inputs:
        a = node.args[inp.source]
        if a not in inputs or a in written or inp.view:
            continue
        t = g.type_of(a)
        if math.prod(t.shape) * DTYPE_BYTES[t.dtype] < L2_PREFETCH_MIN:
            continue
        tile = math.prod(inp.value.type.shape) * DTYPE_BYTES[inp.value.type.dtype]
        if tile > budget:
            continue
        budget -= tile
        k.l2_prefetch(inp, t.shape, 1)


def _narrow(node: Node, g: KernelGraph) -> str | None:
    """The fp16/bf16 dtype a kernel's dots take: the first narrow dtype among its tensors."""
    io = [g.type_of(a).dtype for a in node.args] + [v.type.dtype for v in node.outs]
    return next((d for d in io if d in ("float16", "bfloat16")), None)


def _render_kernel(kname: str, idx: int, node: Node, g: KernelGraph, prefetch: bool = False,
                   paired: bool = False, chain: Chain | None = None, pdl: bool = False,
                   through: list[StoreThrough] | None = None, counts: bool = False, block_fn: bool = False,
                   ordered: bool = False) -> tuple[KernelSpec, str]:
    """One customized op as a @triton.jit kernel and its launcher.

    ``prefetch``: the loop's tiles are loaded one iteration ahead (iteration 0's before the loop,
    iteration i+1's — wrapping to 0 on the last, a harmless in-bounds reload — at the top of
    iteration i), so a tile's memory latency overlaps the previous iteration's work. Triton only
    software-pipelines loads that reach a ``tl.dot`` through shared memory; small-M decode GEMVs
    (a padded dot, operands in registers) otherwise wait a full latency every iteration.
    ``chain``: the kernel also runs its consumer in the last block of each group (``_emit_chained``);
    it takes the consumer's other arguments after its own and writes the consumer's outputs after
    its own. ``through``: outputs stored at a slot of an in-place input, and input rows copied to one as
    an output is tiled (``store_through``): the kernel writes those inputs (outputs after its own for the
    copies), and takes the slot's index and the copied rows as arguments after its own. ``counts``: when its work is
    done, block (0, 0, 0) adds one to the int64 counter it takes last (``codegen.counted``). ``block_fn``: a device
    function ``{kname}_block`` taking the block index (pid0, pid1, pid2) before the pointers, and no launcher.
    ``ordered``: each block stores its part of a cross-block sum in a slot of its own, and the last block of a tile
    adds the slots in order (``BlockWriter.finish_sums``)."""
    b: BlockGraph = node.block
    k = BlockWriter(b, _narrow(node, g))
    early = pdl and not paired and not block_fn  # weights asked of L2 before the wait (``_weights_to_l2``)
    if pdl and not early:  # before any load or store: nothing is touched until the predecessor is complete
        k.emit(PDL_WAIT, 1)
        k.emit(PDL_SIGNAL, 1)
    reduced = [reduced_axes(o, b.grid) for o in b.outputs]
    atomic = [bool(r) for r in reduced]
    # outputs summed over the same grid axes share counters: one per tile of theirs (the product
    # of the other axes), after those of the sets before
    sets = list(dict.fromkeys(r for r in reduced if r))
    tiles = [math.prod(n for a, n in enumerate(b.grid) if a not in r) for r in sets]
    args, outs = tuple(node.args), tuple(v.name for v in node.outs)
    own = {s.out: s for s in through or () if s.copied is None}
    copies = [s for s in through or () if s.copied is not None]
    outs = tuple(own[j].cache if j in own else o for j, o in enumerate(outs)) + tuple(s.cache for s in copies)
    args += tuple(dict.fromkeys(a for s in (*own.values(), *copies) for a in (s.index, s.copied)
                                if a is not None and a not in args))
    if chain is not None:
        tail = g.nodes[chain.consumer]
        args += tuple(tail.args[s] for s in chain.extra_args)
        outs += tuple(v.name for v in tail.outs)
    ordered = ordered and any(atomic)
    summed_parts = [math.prod(b.grid[a] for a in r) for r in reduced]
    spec = KernelSpec(kname, f"launch_{kname}", idx, tuple(b.grid), args, outs,
                      tuple(j for j, a in enumerate(atomic) if a), max(1, b.block_threads // 32),
                      default_stages(b) or 1, paired, sum(tiles) + (chain.groups if chain else 0),
                      chain.consumer if chain else -1, counts,
                      tuple(summed_parts[j] for j, a in enumerate(atomic) if a) if ordered else ())
    params = [f"{p_}_ptr" for p_ in spec.params()]
    grid = tuple(b.grid)
    pids = [a for a in range(3) if b.grid[a] > 1]
    if paired:
        free = next((a for a in range(3) if b.grid[a] == 1), None)
        if free is not None:  # the programs at 1 on an unused axis run the second instance
            grid = tuple(2 if a == free else n for a, n in enumerate(b.grid))
            k.emit(f"if tl.program_id({free}) == 1:  # the second instance: its own pointers", 1)
        else:  # every axis is cut: the upper half of axis 0 runs the second instance
            grid = (2 * b.grid[0], *b.grid[1:])
            k.emit("pid0 = tl.program_id(0)", 1)
            k.emit(f"if pid0 >= {b.grid[0]}:  # the second instance: its own pointers, the same blocks", 1)
            k.emit(f"pid0 -= {b.grid[0]}", 2)
            pids.remove(0)
        for p_ in params:
            k.emit(f"{p_} = {p_}_b", 2)
        params = params + [f"{p_}_b" for p_ in params]
    for a in pids if not block_fn else ():
        k.emit(f"pid{a} = tl.program_id({a})", 1)
    if early:
        _weights_to_l2(k, node, g, frozenset(s.cache for s in through or ()))
        k.emit(PDL_WAIT, 1)
        k.emit(PDL_SIGNAL, 1)
    stores = [f"w{j}_ptr" if atomic[j] else f"o{j}_ptr" for j in range(len(b.outputs))]
    if ordered:  # each block its own slot of the workspace: the slot of its index over the summed axes
        for j, r in enumerate(reduced):
            if r:
                stores[j] = f"(w{j}_ptr + ({k.part_index(r)}) * {math.prod(node.outs[j].type.shape)})"
    shapes = [v.type.shape for v in node.outs]
    for j, s in own.items():  # the row's tile at the slot: offset by the index along the scatter's dim
        shapes[j] = g.type_of(s.cache).shape
        k.emit(f"slot{j} = tl.load(a{args.index(s.index)}_ptr)", 1)
        stores[j] = f"(o{j}_ptr + slot{j} * {math.prod(shapes[j][s.dim + 1:])})"
    _emit_block(k, node, g, stores, [a and not ordered for a in atomic], prefetch, shapes)
    for m, s in enumerate(copies, start=len(node.outs)):  # each block copies the tile it stored of its twin
        o, shape = b.outputs[s.out], g.type_of(s.cache).shape
        src, mask = k.tile_ptrs(f"a{args.index(s.copied)}_ptr", o, g.type_of(s.copied).shape)
        k.emit(f"copy{m} = tl.load({src}{f', mask={mask}' if mask else ''})", 1)
        dst, mask = k.tile_ptrs(f"(o{m}_ptr + slot{s.out} * {math.prod(shape[s.dim + 1:])})", o, shape)
        k.emit(f"tl.store({dst}, copy{m}{f', mask={mask}' if mask else ''})", 1)
    if sets:
        k.emit("tl.debug_barrier()", 1)
    for r, first in zip(sets, itertools.accumulate([0] + tiles)):
        k.finish_sums([(j, o, node.outs[j].type.shape) for j, o in enumerate(b.outputs) if reduced[j] == r], r, first,
                      ordered)
    if chain is not None:
        _emit_chained(k, chain, g, len(node.args), len(node.outs), sum(tiles))
    if counts:  # nothing in this kernel reads the counter (``counted``): no other block waits for this store
        k.emit("if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):", 1)
        k.emit("tl.store(n_ptr, tl.load(n_ptr) + 1)", 2)
    body = "\n".join(k.lines) if k.lines else "    pass"
    spec = dataclasses.replace(spec, grid=grid)
    if block_fn:
        return spec, f"@triton.jit\ndef {kname}_block({', '.join(['pid0', 'pid1', 'pid2', *params])}):\n{body}\n"
    text = f"@triton.jit\ndef {kname}({', '.join(params)}):\n{body}\n"
    return spec, text + "\n" + _launcher(spec) + "\n"


def _emit_block(k: BlockWriter, node: Node, g: KernelGraph, stores: list[str], atomic: list[bool],
                prefetch: bool, shapes: list[tuple[int, ...]] | None = None) -> None:
    """The block graph of ``node`` from its loads to its stores (output j through pointer
    ``stores[j]`` into a tensor of ``shapes[j]``, default its own shape; added atomically where
    ``atomic[j]``), in ``k``'s indentation."""
    b: BlockGraph = node.block
    var = block_variance(b)
    arg_shapes = [g.type_of(a).shape for a in node.args]
    for inp in b.inputs:
        if inp.fmap == -1:
            k.load(inp, arg_shapes[inp.source], 1)
    accums = [n for n in b.nodes if op_info(n.op).category is Category.ACCUM]
    for n in b.nodes:
        if var[n.out.name] == Variance.PRE:
            k.node(n, 1)
    scaled = scaled_sums(b, var)  # deferred sums scaled once, after the loop
    deferred = deferred_sums(b, var, k.fma, scaled)
    stacked = {pair[0].out.name: pair for pair in k.stacked}  # a pair's sum lives under its first accumulator
    in_pairs = {n.out.name for pair in k.stacked for n in pair}
    for n in accums:
        init = '-float("inf")' if n.op == "accum_max" else "0.0"
        if n.out.name in stacked:
            rows, cols = k.pad[n.out.name]
            k.emit(f"{k.name(n.out.name)}_st = tl.full([{2 * cols}, {rows}], 0.0, tl.float32)", 1)
        elif n.out.name in in_pairs:
            continue
        elif n.out.name in deferred:
            r = deferred[n.out.name]
            shape = k.fma_shape(r) if r.op == "matmul" else list(k.pad[r.args[0]])
            k.emit(f"{k.name(n.out.name)}_el = tl.full({shape}, 0.0, tl.float32)", 1)
        elif n.out.name in k.swapped:
            k.emit(f"{k.name(n.out.name)}_t = tl.full({list(k.pad[n.out.name])[::-1]}, 0.0, tl.float32)", 1)
        else:
            k.emit(f"{k.name(n.out.name)} = tl.full({list(k.pad[n.out.name])}, {init}, tl.float32)", 1)
    rescaled_by = {n.args[1] for n in accums if n.op == "accum_sum_rescaled"}
    pair_weights = {w.value.name for pair in k.stacked for w in k.stacked_weights(pair)}
    looped = [inp for inp in b.inputs if inp.fmap != -1 and inp.value.name not in pair_weights]
    tiles = {name: f"{k.name(name)}_w" for name in stacked}  # each pair's two weight tiles, loaded as one
    prefetch = prefetch and b.forloop > 1 and bool(looped or stacked)
    if prefetch:
        for inp in looped:
            k.load(inp, arg_shapes[inp.source], 1, it="0", dst=f"{k.name(inp.value.name)}_next")
        for name, pair in stacked.items():
            k.emit(f"{tiles[name]}_next = {k.stacked_load(pair, arg_shapes, '0')}", 1)
    ind = 1
    if b.forloop > 1:
        k.emit(f"for i in range({b.forloop}):", 1)
        ind = 2
    for m in sorted(rescaled_by):
        k.emit(f"{k.var[m]}_prev = {k.var[m]}", ind)
    for inp in looped:
        if prefetch:
            v = k.var[inp.value.name]
            k.emit(f"{v} = {v}_next", ind)
            k.load(inp, arg_shapes[inp.source], ind, it=f"((i + 1) % {b.forloop})", dst=f"{v}_next")
        else:
            k.load(inp, arg_shapes[inp.source], ind)
    for name, pair in stacked.items():
        if prefetch:
            k.emit(f"{tiles[name]} = {tiles[name]}_next", ind)
            k.emit(f"{tiles[name]}_next = {k.stacked_load(pair, arg_shapes, f'((i + 1) % {b.forloop})')}", ind)
        else:
            k.emit(f"{tiles[name]} = {k.stacked_load(pair, arg_shapes, 'i' if b.forloop > 1 else '0')}", ind)
    skipped = {r.out.name for r in (*deferred.values(), *k.swapped.values(), *(s for s, _ in scaled.values()))}
    skipped |= {k.producer[n.args[0]].out.name for n in (m for pair in k.stacked for m in pair)}
    for n in b.nodes:
        if n.out.name in stacked:
            acc = f"{k.var[n.out.name]}_st"
            k.emit(f"{acc} = {acc} + {k.stacked_dot(stacked[n.out.name], tiles[n.out.name])}", ind)
        elif n.out.name in in_pairs:
            continue
        elif n.out.name in deferred:
            acc, r = f"{k.var[n.out.name]}_el", deferred[n.out.name]
            term = k.fma_product(r) if r.op == "matmul" else k.f32(r.args[0])
            k.emit(f"{acc} = {acc} + {term}", ind)
        elif n.out.name in k.swapped:
            acc = f"{k.var[n.out.name]}_t"
            k.emit(f"{acc} = {acc} + {k.swapped_dot(k.swapped[n.out.name])}", ind)
        elif op_info(n.op).category is Category.ACCUM:
            k.accumulate(n, ind)
        elif var[n.out.name] in (Variance.LOOP, Variance.RUNNING) and n.out.name not in skipped:
            k.node(n, ind)
    for name, r in deferred.items():
        if r.op == "matmul":  # K padding was zeroed in the products
            k.emit(f"{k.var[name]} = {k.fma_sum(r, k.var[name] + '_el')}", 1)
            continue
        src, dim = r.args[0], r.attr("dim")
        m = tile_mask(k.real[src], k.pad[src], [dim])
        x = f"tl.where({m}, {k.var[name]}_el, 0.0)" if m else f"{k.var[name]}_el"
        k.emit(f"{k.var[name]} = tl.sum({x}, axis={dim}, keep_dims={bool(r.attr('keepdim'))})", 1)
        if name in scaled:
            k.rescale(name, scaled[name])
    for name in k.swapped:
        k.emit(f"{k.var[name]} = tl.trans({k.var[name]}_t)", 1)
    for name, (first, second) in stacked.items():  # rows [0, N) the first product's, [N, 2N) the second's
        rows, cols = k.pad[name]
        st = f"{k.var[name]}_st"
        k.emit(f"{st}_a, {st}_b = tl.split(tl.permute(tl.reshape({st}, [2, {cols}, {rows}]), (1, 2, 0)))", 1)
        k.emit(f"{k.var[name]} = tl.trans({st}_a)", 1)
        k.emit(f"{k.name(second.out.name)} = tl.trans({st}_b)", 1)
    for n in b.nodes:
        if var[n.out.name] == Variance.POST and op_info(n.op).category is not Category.ACCUM:
            k.node(n, 1)
    for j, o in enumerate(b.outputs):
        k.store(stores[j], o, shapes[j] if shapes else node.outs[j].type.shape, atomic[j])


def _emit_chained(k: BlockWriter, chain: Chain, g: KernelGraph, n_args: int, n_outs: int, first: int) -> None:
    """After the producer's stores (and its cross-block sums finished): each block counts itself in
    its group (counter ``first`` + the group's index over the matched axes); the last one runs the
    consumer's blocks of that group — block indices on matched axes are the producer's ÷ the ratio,
    free axes are looped — then resets the counter. The barrier and the acquire-release count order
    every block's stores before the last block's loads, which read at L2 (``.cg``), as ``finish_sums``
    does."""
    tail = g.nodes[chain.consumer]
    k.emit("tl.debug_barrier()", 1)
    axes = sorted(a for _, a in chain.matched)
    cnt = k.count_in(axes, first, chain.parts, [chain.ratio(a) for a in axes])
    ptr = {s: f"o{o}_ptr" for s, o in chain.from_producer}
    ptr.update((s, f"a{n_args + m}_ptr") for m, s in enumerate(chain.extra_args))
    t = BlockWriter(tail.block, _narrow(tail, g), prefix="t", args=[ptr[s] for s in range(len(tail.args))],
                base=1, fresh=frozenset(s for s, _ in chain.from_producer))
    for b_axis, a_axis in chain.matched:
        r = chain.ratio(a_axis)
        t.emit(f"{t.pid}{b_axis} = pid{a_axis}" + (f" // {r}" if r > 1 else ""), 1)
    for b_axis in chain.free:
        t.emit(f"for {t.pid}{b_axis} in range({tail.block.grid[b_axis]}):", 1)
        t.base += 1
    _emit_block(t, tail, g, [f"o{n_outs + j}_ptr" for j in range(len(tail.outs))], [False] * len(tail.outs), False)
    k.lines += t.lines
    k.emit(f"tl.store({cnt}, 0)", 2)


def _launcher(spec: KernelSpec) -> str:
    """The python function the runtime registers as a torch custom op (``triton_op``): the kernel
    launched on its tensors as they are (workspaces and counters need no zeroing: ``KernelSpec``)."""
    params = spec.params()
    if spec.paired:  # the second instance's tensors, in the same order, suffixed _b
        params = params + [f"{x}_b" for x in params]
    sig = ", ".join(f"{p}: torch.Tensor" for p in params)
    return (f"def {spec.launcher}({sig}, num_warps: int, num_stages: int) -> None:\n"
            f"    wrap_triton({spec.name})[{spec.grid}]({', '.join(params)}, "
            f"num_warps=num_warps, num_stages=num_stages)\n")
