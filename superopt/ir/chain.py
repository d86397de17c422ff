"""Which customized op can run its consumer in its own last blocks: one launch instead of two.

Flash-decoding is a split kernel and a combine kernel: the combine waits for the whole split grid
to finish, then pays a launch and the first loads' latency of its own (about 2 µs of decode
attention's 9 µs at 4k tokens, batch 1, on an H200). When every block of the consumer reads only
what one *group* of the producer's blocks writes, the producer's blocks can count themselves in per
group, and the last one of each group to finish runs the consumer's blocks of that group (a
semaphore per group, as cross-block sums finish in ``codegen.triton``). This module decides
whether that is legal and how the grids map; the renderer writes it (``render_triton(chain=...)``)
and the profiler decides by timing whether it pays. The μGraph is unchanged: the interpreter and
the verifier see two kernels, exactly what runs.

Legal when (producer A = node ``idx``, consumer B):
- A's outputs are read by B alone (no other node, not graph outputs), and B's other arguments exist
  before A runs (graph inputs or values of earlier nodes);
- B does not sum across blocks (its launch would need a semaphore of its own after the group's);
- every grid axis of B that cuts a dim of a tensor A wrote is *matched* to the axis of A that cuts
  the same dim into as many parts or a multiple of them (block b of B reads exactly what the A
  blocks b·r … b·r + r − 1 on that axis wrote, r the ratio), or *free* where A does not cut that dim
  (the last block of a group runs all of them); an axis of A that cuts a dim B reads whole is
  *gathered*: its blocks form the group, with the r blocks of each matched one.

A that sums an output across blocks (split-K) chains too: its blocks finish their sums first (the
last block of each summed tile stores it, ``codegen.triton``) and only then count themselves into
the chain's group; the summed axes are gathered, so the group's last block runs the consumer after
every sum it reads is stored. Split-K and its epilogue (a residual add, a norm) are then one launch.
"""
from __future__ import annotations

from dataclasses import dataclass

from .graph import KernelGraph
from .tiling import reduced_axes


@dataclass(frozen=True)
class Chain:
    producer: int                       # node index of A
    consumer: int                       # node index of B
    matched: tuple[tuple[int, int], ...]  # (B axis, A axis): B's block index on it is A's ÷ the ratio
    free: tuple[int, ...]               # B axes (extent > 1) the group's last block loops over
    parts: int                          # A blocks in a group (its gathered axes' extents × the ratios)
    groups: int                         # groups (the product of B's matched axes): one counter each
    from_producer: tuple[tuple[int, int], ...]  # (B arg index, A output index) for B's args A writes
    extra_args: tuple[int, ...]         # B arg indices A does not write, in order
    ratios: tuple[int, ...] = ()        # per matched pair, A blocks a B block reads along it (() : all 1)

    def ratio(self, a_axis: int) -> int:
        """A blocks on ``a_axis`` per group index along it (1 where the axes match one to one)."""
        return dict(zip((a for _, a in self.matched), self.ratios)).get(a_axis, 1)


def chain_of(g: KernelGraph, idx: int) -> Chain | None:
    """The chain of customized node ``idx`` into its one consumer, or None where it is not legal."""
    a = g.nodes[idx]
    if a.op != "customized":
        return None
    produced = {v.name: k for k, v in enumerate(a.outs)}
    readers = [j for j, n in enumerate(g.nodes) if j != idx and any(x in produced for x in n.args)]
    if len(readers) != 1 or any(o in produced for o in g.outputs):
        return None
    j = readers[0]
    b = g.nodes[j]
    if b.op != "customized" or j < idx:
        return None
    A, B = a.block, b.block
    if any(reduced_axes(o, B.grid) for o in B.outputs):
        return None
    defined_before = {v.name for v in g.inputs} | {v.name for n in g.nodes[:idx] for v in n.outs}
    from_producer = tuple((s, produced[x]) for s, x in enumerate(b.args) if x in produced)
    extra = tuple(s for s, x in enumerate(b.args) if x not in produced)
    if any(b.args[s] not in defined_before for s in extra):
        return None
    omap = {k: A.outputs[k].omap for k in range(len(A.outputs))}
    matched: dict[int, int] = {}
    free: set[int] = set()
    for inp in B.inputs:
        k = dict(from_producer).get(inp.source)
        if k is None:
            continue
        for axis in (ax for ax in range(3) if B.grid[ax] > 1):
            dim = inp.imap[axis]
            if dim == -1:  # every block along this axis reads the same tile of this tensor
                continue
            cutter = next((ax for ax in range(3) if A.grid[ax] > 1 and omap[k][ax] == dim), None)
            if cutter is None:
                free.add(axis)
            elif A.grid[cutter] % B.grid[axis] or matched.get(axis, cutter) != cutter:
                return None
            else:
                matched[axis] = cutter
    if free & set(matched) or len(set(matched.values())) != len(matched):
        return None
    free |= {ax for ax in range(3) if B.grid[ax] > 1 and ax not in matched}
    gathered = [ax for ax in range(3) if A.grid[ax] > 1 and ax not in matched.values()]
    pairs = tuple(sorted(matched.items()))
    ratios = tuple(A.grid[a] // B.grid[b_axis] for b_axis, a in pairs)
    groups, parts = 1, 1
    for (b_axis, _), r in zip(pairs, ratios):
        groups *= B.grid[b_axis]
        parts *= r
    for ax in gathered:
        parts *= A.grid[ax]
    return Chain(idx, j, pairs, tuple(sorted(free)), parts, groups, from_producer, extra,
                 ratios if any(r > 1 for r in ratios) else ())


def chains(g: KernelGraph) -> dict[int, Chain]:
    """The legal chains of ``g`` by producer node index, in graph order; a node chained into its
    producer is not a producer too (one launch runs two ops, never three)."""
    out: dict[int, Chain] = {}
    consumers: set[int] = set()
    for idx in range(len(g.nodes)):
        c = None if idx in consumers else chain_of(g, idx)
        if c is not None:
            out[idx] = c
            consumers.add(c.consumer)
    return out
