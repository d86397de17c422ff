"""The meaning of the data-movement ops (``ir.movement``) in every Domain, from its slice, concat,
reshape, permute and broadcast.

``gather`` and ``scatter`` read their index operand's integers: a 1-D ``int64`` tensor holds them
as plain integers in every Domain (a numpy or torch integer array, a FieldValue whose residues are
the integers themselves; ``index_input`` makes one). The Domain that evaluates shapes only (the
verifier's degree analysis) has no integers; it takes the positions 0, 1, … (mod the dim), which gives
the same shapes, and its bound holds for every element whatever the positions.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Node
from ..ir.movement import repeat_value

MOVEMENT_OPS = frozenset({"permute", "repeat", "gather", "scatter"})


def apply_movement(n: Node, args: list[Any], domain, offset: int = 0) -> Any:
    """Data-movement node ``n`` on whole values; ``offset`` leading (grid) axes are carried through."""
    if n.op == "permute":
        perm = n.attr("perm")
        return domain.permute(args[0], list(range(offset)) + [offset + p for p in perm])
    if n.op == "repeat":
        return repeat_value(args[0], offset + n.attr("dim"), n.attr("times"), domain)
    if offset:
        raise ValueError(f"{n.op} is a kernel-level op; it has no block-level meaning")
    if n.op == "gather":
        x, idx = args
        dim = n.attr("dim")
        size = domain.shape(x)[dim]
        pos = index_values(idx, domain.shape(idx)[0], size)
        _in_range(n.op, pos, size)
        return domain.concat([domain.slice(x, dim, a, b) for a, b in _runs(pos)], dim)
    if n.op == "scatter":
        x, idx, src = args
        dim = n.attr("dim")
        size = domain.shape(x)[dim]
        pos = index_values(idx, domain.shape(idx)[0], size)
        _in_range(n.op, pos, size)
        if len(set(pos)) != len(pos):
            raise ValueError(f"scatter: indices {pos} repeat a position; the write order would decide "
                             f"the result")
        order = sorted(range(len(pos)), key=lambda k: pos[k])
        pieces, at = [], 0
        for k in order:
            if pos[k] > at:
                pieces.append(domain.slice(x, dim, at, pos[k]))
            pieces.append(domain.slice(src, dim, k, k + 1))
            at = pos[k] + 1
        if at < size:
            pieces.append(domain.slice(x, dim, at, size))
        return pieces[0] if len(pieces) == 1 else domain.concat(pieces, dim)
    raise NotImplementedError(f"evaluate: no rule for data-movement op {n.op!r}")


def index_values(idx: Any, n: int, size: int) -> list[int]:
    """The integers of a 1-D index value of length ``n`` into a dim of ``size``, in any Domain (see
    the module docstring)."""
    if hasattr(idx, "deg"):  # the degree analysis: shapes only; distinct wherever n <= size
        return [k % size for k in range(n)]
    raw = getattr(idx, "p", idx)  # a FieldValue holds the integers as its residues
    if hasattr(raw, "detach"):    # a torch tensor
        raw = raw.detach().cpu().numpy()
    return [int(v) for v in np.asarray(raw).reshape(-1)]


def _in_range(op: str, pos: list[int], size: int) -> None:
    bad = [p for p in pos if not 0 <= p < size]
    if bad:
        raise ValueError(f"{op}: index {bad[0]} out of range for a dim of {size}")


def _runs(pos: list[int]) -> list[tuple[int, int]]:
    """Consecutive positions as [start, stop) runs, in order: gather copies whole runs at once."""
    out: list[list[int]] = []
    for p in pos:
        if out and out[-1][1] == p:
            out[-1][1] += 1
        else:
            out.append([p, p + 1])
    return [(a, b) for a, b in out]


def index_input(values: np.ndarray, domain) -> Any:
    """Integers as an index value of ``domain`` (numpy, field or torch)."""
    values = np.asarray(values, dtype=np.int64)
    if domain.name == "float64":
        return values
    if hasattr(domain, "index_input"):  # the torch Domain: a tensor on its device
        return domain.index_input(values)
    from .field_domain import FieldValue
    return FieldValue(values.copy(), values.copy() if getattr(domain, "track_q", False) else None)


def index_bounds(graph) -> dict[str, tuple[int, bool]]:
    """For every int64 input of ``graph``: (the size of the smallest dim it indexes, whether it must
    hold distinct positions — a scatter's). Random indices are drawn within these."""
    sizes: dict[str, tuple[int, bool]] = {}
    types = {v.name: v.type for v in graph.inputs}
    for n in graph.nodes:
        types.update((v.name, v.type) for v in n.outs)
        if n.op in ("gather", "scatter") and n.args[1] in {v.name for v in graph.inputs}:
            bound = types[n.args[0]].shape[n.attr("dim")]
            old = sizes.get(n.args[1], (bound, False))
            sizes[n.args[1]] = (min(old[0], bound), old[1] or n.op == "scatter")
    return sizes


def random_indices(graph, rng: np.random.Generator, domain) -> dict[str, Any]:
    """Random valid positions for every int64 input of ``graph`` (distinct where a scatter needs it)."""
    bounds = index_bounds(graph)
    out = {}
    for v in graph.inputs:
        if v.type.dtype != "int64":
            continue
        n = v.type.shape[0]
        bound, distinct = bounds.get(v.name, (1, False))
        if distinct or n <= bound:
            vals = rng.permutation(bound)[:n] if n <= bound else rng.integers(0, bound, n)
        else:
            vals = rng.integers(0, bound, n)
        out[v.name] = index_input(vals, domain)
    return out


__all__ = ["MOVEMENT_OPS", "apply_movement", "index_bounds", "index_input", "index_values", "random_indices"]
