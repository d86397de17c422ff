"""A row-wise Lax program at another number of rows, without tracing the model again.

patch() extracts each site's program once per batch bucket; ``torch.export`` costs ~0.1 s a
program, most of a warm patch's time. A site program maps ``x: [M, D]`` row by row, so the program
for ``m`` rows is the same nodes with every type inferred again from ``x: [m, D]``. Where the rows
count could hide in an attribute (a reshape's target shape, a slice or concat along the rows), or
an inferred type does not come out with ``m`` rows, ``with_rows`` refuses and the caller traces.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..ir import KernelGraph, Node, ShapeError, TensorType, Value, check, infer_type

_SHAPE_ATTR_OPS = frozenset({"reshape"})            # attributes that may spell the rows count
_DIM_ATTR_OPS = frozenset({"slice", "concat", "split"})


class RowsError(ValueError):
    """The program cannot be re-typed for another rows count by inference alone."""


def with_rows(program: KernelGraph, rows_inputs: str | Sequence[str], m: int, name: str) -> KernelGraph:
    """``program`` for ``m`` rows of input(s) ``rows_inputs`` (dim 0 of each, all with the same rows:
    the activations, e.g. ``x`` and a residual), renamed ``name``."""
    names = [rows_inputs] if isinstance(rows_inputs, str) else list(rows_inputs)
    given = [v for v in program.inputs if v.name in names]
    missing = set(names) - {v.name for v in given}
    if missing or not given:
        raise RowsError(f"{program.name}: no input %{(sorted(missing) or ['(none named)'])[0]}")
    old_rows = given[0].type.shape[0]
    if any(v.type.shape[:1] != (old_rows,) for v in given):
        raise RowsError(f"{program.name}: inputs {names} do not share their rows")
    rows_values = set(names)  # values whose dim 0 is the rows dim
    inputs = tuple(Value(v.name, TensorType((m,) + v.type.shape[1:], v.type.dtype)) if v.name in rows_values else v
                   for v in program.inputs)
    types = {v.name: v.type for v in inputs}
    nodes = []
    for n in program.nodes:
        if n.op == "customized" or len(n.outs) != 1:
            raise RowsError(f"{program.name}: {n.op} node (not a single-output library op)")
        if not any(a in rows_values for a in n.args):  # its operands did not change, nor does it
            types[n.out.name] = n.out.type
            nodes.append(n)
            continue
        if _may_spell_rows(n, len(types[n.args[0]].shape)):
            raise RowsError(f"{program.name}: {n.op} with attributes that may depend on the rows")
        try:
            t = infer_type(n.op, [types[a] for a in n.args], n.attrs)
        except ShapeError as e:  # e.g. an operand that keeps the old rows: not re-typed here
            raise RowsError(f"{program.name}: %{n.out.name}: {e}") from None
        old = n.out.type.shape
        if not (t.shape and old and old[0] == old_rows and t.shape[0] == m and t.shape[1:] == old[1:]):
            raise RowsError(f"{program.name}: %{n.out.name} does not keep the rows as dim 0")
        rows_values.add(n.out.name)
        types[n.out.name] = t
        nodes.append(replace(n, outs=(Value(n.out.name, t),)))
    for o in program.outputs:
        if o not in rows_values:
            raise RowsError(f"{program.name}: output %{o} is not row-wise")
    return check(KernelGraph(inputs, tuple(nodes), program.outputs, name))


def _may_spell_rows(n: Node, rank: int) -> bool:
    return n.op in _SHAPE_ATTR_OPS or (n.op in _DIM_ATTR_OPS and n.attr("dim") in (0, -rank))


__all__ = ["RowsError", "with_rows"]
