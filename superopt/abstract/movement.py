"""Slices, concats and permutes in the index analysis and the normal form.

A slice or a concat changes which index a dim ranges over: ``x[..., 4:8]`` ranges over a new
index ``j`` of 4 elements, not over ``x``'s index ``i``. The normal form keeps its single-index
dims by writing the movement as a *linear map with a selection matrix*:

    slice(x)[j]          = Σ_i x[i] · S(i, j)            S = "@slice4:8", an atom over (i, j)
    concat(a, b)[i]      = Σ_j a[j] · P₀(j, i) + Σ_k b[k] · P₁(k, i)

which is exactly what the movement is (S and P are 0/1 matrices) with the matrices left
uninterpreted. Every axiom of the normal form holds for it (it is multilinear), so two programs
that move data the same way get the same normal form, and a value computed inside a block is a
subexpression of the program's target just as for arithmetic. The atoms' names start with ``@``,
which no program input has, so they are never taken for a tensor a kernel must read.

A permute only renames which dim holds which index: its normal form is its operand's.

The analysis (``program.analyze``) gives each sliced or concatenated dim its own index id and
records the maps between ids in ``ProgramIndex.movement``; the block search uses them to label
a moved tile (``block_labels``) and refuses a slice or concat along a dim that the grid or the
for-loop cuts (a block would hold part of it). Those indices are *pinned*: the reduced-shape
verification keeps their full size, because the slice offsets are fixed numbers.
"""
from __future__ import annotations

from .nf import NFStore, NotNormalizable

MOVED_OPS = frozenset({"slice", "concat", "permute"})


def analyze_node(n, shape: dict, union) -> list[tuple]:
    """Union the dims a movement op keeps; return the moved (value, dim) pairs it creates, each
    as ("slice", (arg, dim), (out, dim), start, stop) or ("concat", [(arg, dim)…], (out, dim))."""
    o = n.out.name
    if n.op == "permute":
        for d, p in enumerate(n.attr("perm")):
            union((n.args[0], p), (o, d))
        return []
    dim = n.attr("dim")
    for a in n.args:
        for d in range(len(shape[a])):
            if d != dim:
                union((a, d), (o, d))
    if n.op == "slice":
        return [("slice", (n.args[0], dim), (o, dim), n.attr("start"), n.attr("stop"))]
    return [("concat", [(a, dim) for a in n.args], (o, dim))]


def movement_table(moved: list[tuple], label) -> tuple[dict, frozenset]:
    """(``ProgramIndex.movement``, pinned ids) from the moved dims of ``analyze_node``."""
    table: dict = {}
    pinned: set[int] = set()
    for m in moved:
        if m[0] == "slice":
            i, j = label(m[1]), label(m[2])
            table[("slice", i, m[3], m[4])] = j
            pinned.update((i, j))
        else:
            parts = tuple(label(x) for x in m[1])
            table[("concat", parts)] = label(m[2])
            pinned.update(parts + (label(m[2]),))
    pinned.discard(-1)
    return table, frozenset(pinned)


def movement_nf(store: NFStore, op: str, args: list[int], attrs: dict, arg_labels: list[tuple],
                out_labels: tuple, parts: str) -> int:
    """The normal form of a slice / concat / permute (see the module docstring)."""
    if op == "permute":
        return args[0]
    dim = attrs["dim"]
    i = out_labels[dim]
    if op == "slice":
        src = arg_labels[0][dim]
        if src < 0 or i < 0:
            raise NotNormalizable("slice of a size-1 dim")
        sel = store.atom(f"@slice{attrs['start']}:{attrs['stop']}", (src, i))
        return store.reduce(store.mul(args[0], sel), ((src, parts),))
    total, offset = store.ZERO, 0
    for k, (e, labels) in enumerate(zip(args, arg_labels)):
        j = labels[dim]
        if j < 0 or i < 0 or j == i:
            raise NotNormalizable("concat of size-1 pieces")
        place = store.atom(f"@cat{k}:{offset}", (j, i))
        total = store.add(total, store.reduce(store.mul(e, place), ((j, parts),)))
    return total


def block_labels(table: dict, tiled: set, op: str, labels: list[tuple], attrs: dict) -> tuple | None:
    """Labels of a moved tile in the block search; None where the move is not the program's or
    cuts a dim the grid or the for-loop partitions."""
    if op == "permute":
        return tuple(labels[0][p] for p in attrs["perm"])
    dim = attrs["dim"]
    if any(lab[dim] in tiled for lab in labels):
        return None
    if op == "slice":
        j = table.get(("slice", labels[0][dim], attrs["start"], attrs["stop"]))
        out = list(labels[0])
    else:
        if any(lab[:dim] + lab[dim + 1:] != labels[0][:dim] + labels[0][dim + 1:] for lab in labels):
            return None
        j = table.get(("concat", tuple(lab[dim] for lab in labels)))
        out = list(labels[0])
    if j is None or j in tiled:
        return None
    out[dim] = j
    return tuple(out)


__all__ = ["MOVED_OPS", "analyze_node", "block_labels", "movement_nf", "movement_table"]
