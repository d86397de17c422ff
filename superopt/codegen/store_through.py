"""A cache write stored by the kernel that computes the row: a kernel-level scatter lowered into its producer.

A decode step writes its new key into the cache as ``scatter(cache, pos, row) [dim=d]``: the row, one
slot along ``d``, computed by a customized kernel (RoPE on k), written at ``pos`` of a cache the caller
lets the graph write in place (``CompiledGraph(in_place=…)``). Run as a library op, that write is a
launch of its own (``index_copy_``) between two kernels, and it breaks their chain of dependent launches
(PDL). Where the row's only reader is the scatter, the producer's kernel stores its tile at the slot
instead of into a buffer: the same values in the same place, one launch fewer. The value row beside it
(``scatter(v_cache, pos, v)``, ``v`` an input no kernel computes) is then copied by the same kernel,
each block loading and storing the tile of ``v`` that it stores of the key row: no launch at all.

This changes how the μGraph runs, not the μGraph: the graph the search found and the verifier checked
is the one rendered, with the scatter's store moved into the kernel whose output it copies.
docs/architecture.md ("Decode attention") says why the searched attention needed it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..ir import KernelGraph, reduced_axes


@dataclass(frozen=True)
class StoreThrough:
    """Output ``out`` of kernel node ``kernel`` stored at slot ``index[0]`` of ``cache`` along ``dim``, or,
    where ``copied`` names an input, that input's row, tiled as output ``out`` is; scatter node ``scatter``
    then runs nowhere (its value is ``cache``, written in place)."""

    scatter: int
    kernel: int
    out: int
    cache: str
    index: str
    dim: int
    copied: str | None = None


def stores_through(g: KernelGraph, in_place: Iterable[str], excluded: frozenset[int] = frozenset()) \
        -> tuple[StoreThrough, ...]:
    """The scatters of ``g`` into ``in_place`` inputs that kernels can store themselves: their producers', then
    input rows copied beside a stored row of the same shape (``_copies``).

    The conditions, each what makes the kernel's store the scatter's: the row has one slot along the
    scatter's dim and its index one position (an input, read by the kernel); the row is the kernel's
    own output, not summed across blocks (its tile stored once, by one block), in the cache's dtype,
    and read by nothing but the scatter; the cache has no other reader (``in_place`` ensures it), so
    writing it earlier, when the kernel runs, changes nothing another node reads. ``excluded``:
    kernels rendered another way (chained with a consumer, ``ir.chain``), left as they are."""
    inputs = {v.name: v.type for v in g.inputs}
    targets = set(in_place) & inputs.keys()
    scatters = [(idx, n) for idx, n in enumerate(g.nodes) if n.op == "scatter" and n.args[0] in targets
                and n.args[1] in inputs and inputs[n.args[1]].shape == (1,)]
    producer = {v.name: (i, j) for i, n in enumerate(g.nodes) if n.op == "customized"
                for j, v in enumerate(n.outs)}
    readers: dict[str, int] = {}
    for n in g.nodes:
        for a in set(n.args):
            readers[a] = readers.get(a, 0) + 1
    own = []
    for idx, n in scatters:
        cache, index, row = n.args
        if row not in producer or row in g.outputs or readers.get(row) != 1:
            continue
        k, j = producer[row]
        node, dim = g.nodes[k], n.attr("dim")
        row_type = node.outs[j].type
        if k in excluded or row_type.shape[dim] != 1 or row_type.dtype != inputs[cache].dtype \
                or reduced_axes(node.block.outputs[j], node.block.grid):
            continue
        own.append(StoreThrough(idx, k, j, cache, index, dim))
    return tuple(own) + _copies(g, scatters, own, inputs)


def _copies(g: KernelGraph, scatters: list, stored: list[StoreThrough], inputs: dict) -> tuple[StoreThrough, ...]:
    """Of ``scatters``, those of an input row that a kernel storing a row of the same type at the same slot
    can copy as it stores its own: same index and dim, caches of one type. (Reading an input earlier than
    the scatter would changes nothing; the cache has no other reader.)"""
    out = []
    for idx, n in scatters:
        cache, index, row = n.args
        if row not in inputs:
            continue
        twin = next((s for s in stored if s.index == index and s.dim == n.attr("dim")
                     and inputs[s.cache] == inputs[cache]
                     and g.nodes[s.kernel].outs[s.out].type == inputs[row]), None)
        if twin is not None:
            out.append(StoreThrough(idx, twin.kernel, twin.out, cache, index, twin.dim, copied=row))
    return tuple(out)
