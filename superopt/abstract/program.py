"""Index analysis of a Lax program and its abstract (normal-form) expressions.

Every dim of every program value gets an *index id*: dims that must range together (operands of
an elementwise op, the contracted dims of a matmul, kept dims of a reduction) share one id, found
by union-find. Broadcast size-1 dims and keepdim dims get the label -1. The ids give the search its tiling
vocabulary: a grid axis or the for-loop partitions one index, and every input that has it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import KernelGraph
from ..ir.ops import BINARY_OPS, UNARY_OPS
from .movement import MOVED_OPS, analyze_node, movement_nf, movement_table
from .nf import ALL, NFStore, NotNormalizable

# Ops the abstract domain models; a program with any other op is searched only as its fallback.
MODELED_OPS = UNARY_OPS | BINARY_OPS | {"const", "matmul", "reduce_sum", "transpose", "cast"} | MOVED_OPS


class Unsupported(ValueError):
    pass


@dataclass(frozen=True)
class ProgramIndex:
    labels: dict            # value name -> tuple of index ids (-1: a size-1 dim)
    sizes: dict             # index id -> extent
    consts: tuple           # (value, dtype) of each const node, in program order
    ops: frozenset          # op names the program uses
    movement: dict = field(default_factory=dict)  # slice / concat maps between ids (abstract.movement)
    pinned: frozenset = frozenset()                # ids a reduced shape keeps whole (fixed offsets)


def _align(name, s, o, so, rank, union, broadcast) -> None:
    """Operand dims aligned from the right with the result's: equal sizes are one index, a size-1
    operand dim against a larger one broadcasts."""
    off = len(so) - len(s)
    for d in range(rank):
        if s[d] == so[off + d]:
            union((name, d), (o, off + d))
        elif s[d] == 1:
            broadcast.add((name, d))


def analyze(program: KernelGraph) -> ProgramIndex:
    """Label every dim of every value with an index id; raise ``Unsupported`` for unmodelled ops."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    broadcast: set[tuple[str, int]] = set()
    moved: list[tuple] = []
    shape = {v.name: v.type.shape for v in program.inputs}
    order: list[tuple[str, int]] = [(v.name, d) for v in program.inputs for d in range(v.type.rank)]
    for n in program.nodes:
        if n.op not in MODELED_OPS:
            raise Unsupported(f"op {n.op!r} is outside the search space")
        o = n.out.name
        shape[o] = n.out.type.shape
        order += [(o, d) for d in range(len(shape[o]))]
        if n.op in UNARY_OPS or n.op == "cast":
            for d in range(len(shape[o])):
                union((n.args[0], d), (o, d))
        elif n.op in BINARY_OPS:
            for name in n.args:
                _align(name, shape[name], o, shape[o], len(shape[name]), union, broadcast)
        elif n.op == "reduce_sum":
            a, dim, keep = n.args[0], n.attr("dim"), n.attr("keepdim")
            for d in range(len(shape[a])):
                if d != dim:
                    union((a, d), (o, d if keep or d < dim else d - 1))
        elif n.op == "matmul":
            a, b = n.args
            sa, sb, so = shape[a], shape[b], shape[o]
            union((a, len(sa) - 1), (b, len(sb) - 2))
            union((a, len(sa) - 2), (o, len(so) - 2))
            union((b, len(sb) - 1), (o, len(so) - 1))
            for name, s in ((a, sa), (b, sb)):
                _align(name, s[:-2], o, so[:-2], len(s) - 2, union, broadcast)
        elif n.op == "transpose":
            r = len(shape[o])
            for d in range(r):
                union((n.args[0], d), (o, d if d < r - 2 else (2 * r - 3 - d)))
        elif n.op in MOVED_OPS:
            moved += analyze_node(n, shape, union)
    # Index ids follow the inputs' dims, so a program at another shape gets the same ids (structure
    # reuse) — also when a batch dim is 1. A size-1 dim broadcast against a larger one, or one a
    # keepdim reduction made, is no index (-1).
    bcast = {find(x) for x in broadcast}
    ids: dict[tuple[str, int], int] = {}
    sizes: dict[int, int] = {}
    for v in program.inputs:
        for d in range(v.type.rank):
            root = find((v.name, d))
            if root not in ids and root not in bcast:
                ids[root] = len(ids)
                sizes[ids[root]] = shape[v.name][d]
    for name, d in order:  # a dim a slice or a concat made: an index of its own, after the inputs'
        root = find((name, d))
        if root not in ids and root not in bcast and shape[name][d] != 1:
            ids[root] = len(ids)
            sizes[ids[root]] = shape[name][d]
    labels = {name: tuple(ids.get(find((name, d)), -1) if s[d] == 1 else ids[find((name, d))]
                          for d in range(len(s))) for name, s in shape.items()}
    consts = tuple((n.attr("value"), n.attr("dtype")) for n in program.nodes if n.op == "const")
    table, pinned = movement_table(moved, lambda x: labels[x[0]][x[1]])
    return ProgramIndex(labels, sizes, consts, frozenset(n.op for n in program.nodes), table, pinned)


def apply_abstract(store: NFStore, op: str, args: list[int], attrs: dict, arg_labels: list[tuple],
                   out_labels: tuple, parts: str = ALL) -> int:
    """The normal form of one op. ``parts`` names what a reduction binds (``*`` at program level,
    ``t`` for a reduction over a tile)."""
    if op == "const":
        return store.const(attrs["value"])
    if op in ("cast", "transpose"):
        return args[0]
    if op in MOVED_OPS:
        return movement_nf(store, op, args, attrs, arg_labels, out_labels, parts)
    if op == "neg":
        return store.scale(args[0], -1)
    if op == "square":
        return store.mul(args[0], args[0])
    if op in UNARY_OPS:
        return store.fn(op, args[0])
    if op == "add":
        return store.add(args[0], args[1])
    if op == "sub":
        return store.add(args[0], args[1], -1)
    if op == "mul":
        return store.mul(args[0], args[1])
    if op == "div":
        return store.div(args[0], args[1])
    if op == "reduce_sum":
        idx = arg_labels[0][attrs["dim"]]
        if idx < 0:  # a sum of one element is the element
            return args[0]
        return store.reduce(args[0], ((idx, parts),))
    if op == "matmul":
        k = arg_labels[0][-1]
        if k != arg_labels[1][-2]:
            raise NotNormalizable("matmul contracts dims of different indices")
        prod = store.mul(args[0], args[1])
        return prod if k < 0 else store.reduce(prod, ((k, parts),))
    raise NotNormalizable(f"op {op} is not modelled")


def program_exprs(program: KernelGraph, index: ProgramIndex, store: NFStore) -> dict[str, int]:
    """The normal form of every value of ``program`` (whole-index reductions)."""
    store.movement = index.movement  # the block search labels moved tiles by it (abstract.movement)
    store.sizes.update(index.sizes)  # Σ_i c = n·c needs the extents
    env: dict[str, int] = {v.name: store.atom(v.name, index.labels[v.name]) for v in program.inputs}
    for n in program.nodes:
        attrs = dict(n.attrs)
        env[n.out.name] = apply_abstract(store, n.op, [env[a] for a in n.args], attrs,
                                         [index.labels[a] for a in n.args], index.labels[n.out.name])
    return env
