"""Turn kernel skeletons into μGraphs at given extents and shapes (structure reuse), and shrink programs.

``build`` fills every tile shape of a design in by the tiling rules (``ir.tiling``) and shape
inference, for the grid / loop extents chosen per kernel, at the shape of whatever program it is
given: the same skeletons serve the searched shape, a reduced shape for cheap verification, and
other shape buckets later. ``extent_choices`` derives candidate extents from the shapes.
"""
from __future__ import annotations

from ..abstract import ProgramIndex
from ..ir import (BlockGraph, BlockInput, BlockOutput, KernelGraph, Node, TensorType, Value, infer_type,
                  input_tile_shape, make_attrs, output_shape)
from ..ir.ops import Category, op_info
from .skeleton import Design, KernelSkeleton

Extents = tuple  # per kernel: (grid (x, y, z), forloop, threads)


def build(design: Design, program: KernelGraph, index: ProgramIndex, extents: tuple[Extents, ...],
          name: str | None = None) -> KernelGraph:
    types = {v.name: v.type for v in program.inputs}
    nodes = [build_kernel(k, types, index, e) for k, e in zip(design, extents)]
    return assemble(program, nodes, name)


def build_kernel(k: KernelSkeleton, types: dict, index: ProgramIndex, extents: Extents) -> Node:
    """One customized node; records its outputs' types in ``types`` (device tensor name -> type)."""
    grid, forloop, threads = extents
    block, out_types = _block(k, types, index, grid, forloop, threads)
    outs = []
    for (_, _, _, dev), t in zip(k.outputs, out_types):
        types[dev] = t
        outs.append(Value(dev, t))
    return Node("customized", k.sources, tuple(outs), (), block)


def assemble(program: KernelGraph, nodes: list[Node], name: str | None = None) -> KernelGraph:
    return KernelGraph(program.inputs, tuple(nodes), program.outputs, name or f"{program.name}_fused")


def _block(k: KernelSkeleton, types: dict, index: ProgramIndex, grid, forloop, threads):
    vals: list[Value] = []
    inputs = []
    for j, (arg, imap, fmap) in enumerate(k.inputs):
        src = types[k.sources[arg]]
        tile = input_tile_shape(src.shape, grid, imap, fmap, forloop)
        v = Value(f"i{j}", TensorType(tile, src.dtype))
        vals.append(v)
        inputs.append(BlockInput(v, arg, imap, fmap))
    nodes = []
    for j, (op, refs, attrs) in enumerate(k.nodes):
        if op == "const":
            value, dtype = index.consts[dict(attrs)["index"]]
            at = make_attrs(value=value, dtype=dtype)
        else:
            at = make_attrs(**dict(attrs))
        t = infer_type(op, [vals[r].type for r in refs], at)
        v = Value(f"v{j}", t)
        vals.append(v)
        nodes.append(Node(op, tuple(vals[r].name for r in refs), (v,), at))
    outputs, out_types = [], []
    for ref, omap, reduce, _ in k.outputs:
        v = vals[ref]
        outputs.append(BlockOutput(v.name, omap, reduce if _reduces(grid, omap) else "none"))
        out_types.append(TensorType(output_shape(v.type.shape, grid, omap), v.type.dtype))
    return BlockGraph(grid, threads, forloop, tuple(inputs), tuple(nodes), tuple(outputs),
                      _thread_groups(nodes, {o.value for o in outputs})), out_types


def _reduces(grid, omap) -> bool:
    return any(omap[a] == -1 and grid[a] > 1 for a in range(3))


def _thread_groups(nodes: list[Node], outputs: set[str]) -> tuple[tuple[str, ...], ...]:
    """Elementwise nodes whose every consumer is elementwise or an accumulator stay in registers;
    connected ones form one group (thread-level fusion)."""
    elementwise = {n.out.name for n in nodes if op_info(n.op).category in (Category.UNARY, Category.BINARY)}
    consumers: dict[str, list[Node]] = {}
    for n in nodes:
        for a in n.args:
            consumers.setdefault(a, []).append(n)
    fusable = [n.out.name for n in nodes if n.out.name in elementwise and n.out.name not in outputs
               and consumers.get(n.out.name)
               and all(c.out.name in elementwise or op_info(c.op).category is Category.ACCUM
                       for c in consumers[n.out.name])]
    group_of = {x: i for i, x in enumerate(fusable)}
    for n in nodes:  # merge a fusable node's group with its fusable producers'
        if n.out.name in group_of:
            for a in n.args:
                if a in group_of:
                    old, new = group_of[a], group_of[n.out.name]
                    for x, g in group_of.items():
                        if g == old:
                            group_of[x] = new
    groups: dict[int, list[str]] = {}
    for x in fusable:
        groups.setdefault(group_of[x], []).append(x)
    return tuple(tuple(g) for g in groups.values())


# ---------------------------------------------------------------- extents


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pick(n: int, tiles: tuple[int, ...], limit: int = 12) -> list[int]:
    """Extents e ≥ 2 dividing n whose tile n/e is a preferred size; else the nearest few.

    ``limit`` only guards against long tile lists: the preferred sizes are few (about ten), and
    every one is kept. Thinning them to five (an earlier rule) dropped exactly the tilings the
    hand-written decode GEMVs won with at 8 rows: 48 and 32 columns a block (128 blocks of
    Llama-3-8B's 6144 and 4096 columns, about one wave of 132 SMs) and K slices of 512 (o and down
    projections); ``benchmarks/fixture_gap.py`` shows which rows need which."""
    good = [e for e in _divisors(n) if e >= 2 and n // e in tiles]
    if not good:
        good = sorted((e for e in _divisors(n) if e >= 2), key=lambda e: abs(n // e - 64))[:2]
    good = sorted(good)
    if len(good) <= limit:
        return good
    step = (len(good) - 1) / (limit - 1)  # spread over the range of tile sizes
    return sorted({good[round(i * step)] for i in range(limit)})


SPLITS = 64  # the most blocks a split kernel cuts one reduction into besides those of ``_pick``


def split_counts(n: int, picked: list[int]) -> list[int]:
    """Extents of the grid axis a split kernel's blocks sum across (flash decoding's KV splits).

    What matters there is the *number* of parts: with the other grid axes it sets the block count,
    and decode attention is fastest at one to four waves of blocks whatever the context length
    (the hand-written kernel's rule, ``runtime.retile.split_kv_tilings``). Parts of a preferred
    size (``picked``, from ``_pick``) give only 64-1024 splits at 32k tokens, so every divisor up to ``SPLITS`` is
    offered too: 4-8 splits of 4096 tokens (Llama-3-8B 32k at 8 rows, 512 blocks) and 32 of 1024
    (one row, 256 blocks) were not in the space. A part keeps at least two rows to walk."""
    return sorted(set(picked) | {e for e in _divisors(n) if 2 <= e <= SPLITS and n // e >= 2})


def extent_choices(k: KernelSkeleton, index: ProgramIndex, tiles: tuple[int, ...],
                   threads: tuple[int, ...], loop_tiles: tuple[int, ...] | None = None) -> list[Extents]:
    """Grid extents whose tiles are ``tiles`` sizes, for-loop ranges whose per-iteration slices
    are ``loop_tiles`` sizes (default: ``tiles``), at the first thread count."""
    p = k.pattern
    per_axis: list[list[int]] = []
    for idx in p.grid:
        n = index.sizes[idx]
        # grid tiles may be as small as one row (a whole-row kernel such as nTrans needs it)
        grid_tiles = (1, 2, 4, 8) + tuple(tiles)
        picked = _pick(n, tuple(t * 2 for t in tiles) if idx == p.loop else grid_tiles)
        per_axis.append(split_counts(n, picked) if idx == p.split else picked)
    combos: list[list[int]] = [[]]
    for opts in per_axis:
        combos = [c + [e] for c in combos for e in opts]
    out = []
    threads = threads[:1]  # the thread count is chosen after the tiling (``driver``), without a rebuild
    for c in combos:
        grid = tuple(c) + (1,) * (3 - len(c))
        loops = [1]
        if p.loop >= 0:
            n = index.sizes[p.loop]
            if p.loop in p.grid:
                n //= grid[p.grid.index(p.loop)]
            # a loop of one iteration too: the loop-less design of the same grid is then one of this
            # design's extents, and the two share the profiler's candidates (``driver._family``)
            loops = [1] + _pick(n, loop_tiles or tiles)
        for f in loops:
            for t in threads:
                out.append((grid, f, t))
    return out


def sparse_extents(k: KernelSkeleton, index: ProgramIndex, tiles: tuple[int, ...],
                   loop_tiles: tuple[int, ...] | None = None, limit: int = 5) -> set[tuple]:
    """The (grid, forloop) pairs of ``extent_choices`` on a sparse lattice: at most ``limit``
    extents an axis and a loop, spread over the range, no loop of one iteration. The search's
    earlier, only lattice: ranked by the cost model, its cheapest shapes won most rows on the GPU
    (``driver._diverse`` keeps them, and the dense lattice's band besides)."""
    p = k.pattern
    per_axis = [_pick(index.sizes[i], tuple(t * 2 for t in tiles) if i == p.loop else (1, 2, 4, 8) + tuple(tiles),
                      limit) for i in p.grid]
    combos: list[list[int]] = [[]]
    for opts in per_axis:
        combos = [c + [e] for c in combos for e in opts]
    out = set()
    for c in combos:
        grid = tuple(c) + (1,) * (3 - len(c))
        if p.loop < 0:
            out.add((grid, 1))
            continue
        n = index.sizes[p.loop] // (grid[p.grid.index(p.loop)] if p.loop in p.grid else 1)
        out.update((grid, f) for f in _pick(n, loop_tiles or tiles, limit))
    return out


def reduced_extents(k: KernelSkeleton, index: ProgramIndex) -> Extents:
    """Extents for a reduced-shape instance: 2 per tiled part (sizes from ``reduced_sizes``)."""
    p = k.pattern
    grid = tuple(2 if index.sizes[i] % 2 == 0 else 1 for i in p.grid) + (1,) * (3 - len(p.grid))
    f = 1
    if p.loop >= 0:
        n = index.sizes[p.loop] // (grid[p.grid.index(p.loop)] if p.loop in p.grid else 1)
        f = 2 if n % 2 == 0 else 1
    return grid, f, 128


def reduced_sizes(design: Design, index: ProgramIndex, untiled: int = 5, tile: int = 3) -> dict[int, int]:
    """Small odd-tiled index sizes that still admit every kernel's tiling (2 blocks, 2 iterations)."""
    out = {}
    for i, n in index.sizes.items():
        if i in index.pinned:  # sliced / concatenated: offsets are fixed numbers (abstract.movement)
            out[i] = n
            continue
        g = 2 if any(i in k.pattern.grid for k in design) else 1
        f = 2 if any(i == k.pattern.loop for k in design) else 1
        out[i] = min(n, untiled) if g * f == 1 else min(n, g * f * tile)
    return out


def reshape_program(program: KernelGraph, index: ProgramIndex, sizes: dict[int, int]) -> KernelGraph:
    """The same program with every index resized (constants unchanged, shapes re-inferred)."""
    inputs = tuple(Value(v.name, TensorType(tuple(1 if l < 0 else sizes[l] for l in index.labels[v.name]),
                                            v.type.dtype)) for v in program.inputs)
    types = {v.name: v.type for v in inputs}
    nodes = []
    for n in program.nodes:
        t = infer_type(n.op, [types[a] for a in n.args], n.attrs)
        types[n.out.name] = t
        nodes.append(Node(n.op, n.args, (Value(n.out.name, t),), n.attrs))
    return KernelGraph(inputs, tuple(nodes), program.outputs, program.name)
