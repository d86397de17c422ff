"""The constants of a μGraph: which values are computed from constants alone, and the value a
constant keeps after a cast narrows it.

The finite-field trials and the float64 check evaluate every op exactly and every cast as the
identity, so on their own they see ``cast(1/2304 : float32) -> bfloat16`` as 1/2304, while a GPU
multiplies by 1/2304 rounded to bfloat16 (0.2% high: the shipped Gemma-2 μGraphs' mean(x²), issue
32). A constant is the one value whose rounding is known before any input arrives, so
``held_constants`` writes it into the graph: each narrowing cast of a constant becomes a ``const``
of the rounded value, and a ``const`` declared in a 16-bit dtype takes its 16-bit value. A float32
or float64 ``const`` stays the rational it is written as: the canonical rewrites spell their own
constants (gelu_tanh's 0.044715) in float64, and a float32 spelling of the same constant must not
differ from them (``tests/superopt/verify/test_identities.py``). Arithmetic stays exact, as
everywhere in the formal model. No site program of the registry's models narrows a constant or
declares one in 16 bits (checked for eight families, one layer each, issue 32), and the search
narrows one only where the program does (``precision.PrecisionFloor`` rule 2): a searched μGraph
and its program round alike.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..interp import NumpyDomain
from ..ir import KernelGraph
from ..ir.graph import Node, make_attrs
from ..ir.ops import DTYPE_BYTES, Category, op_info


def round_to(value: float, dtype: str) -> float:
    """``value`` rounded to nearest-even in ``dtype`` (float64 and non-float dtypes: unchanged; out
    of range: ±inf)."""
    with np.errstate(over="ignore"):
        return _round(value, dtype)


def _round(value: float, dtype: str) -> float:
    if dtype == "float32":
        return float(np.float32(value))
    if dtype == "float16":
        return float(np.float16(value))
    if dtype == "bfloat16":   # float32's top 16 bits, rounded to nearest even on the 16 dropped
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.array(bits, dtype=np.uint32).view(np.float32))
    return value


def constant_values(nodes, rounded: bool = False) -> dict[str, float]:
    """Value name -> its value, for the values computed from constants alone (a scalar ``const``
    and elementwise ops and casts of such values), in float64. ``rounded``: a narrowing cast, and a
    const declared in a 16-bit dtype, round to their dtype; else casts are identities — the value
    as written, which is how ``precision`` keys a program's constants."""
    dom, vals, width = NumpyDomain(), {}, {}
    for n in nodes:
        if len(n.outs) != 1:   # a customized kernel: never a constant
            continue
        if n.op == "const":
            x, dt = float(n.attr("value")), n.out.type.dtype
            vals[n.out.name] = round_to(x, dt) if rounded and DTYPE_BYTES[dt] < 4 else x
        elif n.args and all(a in vals for a in n.args):
            if n.op == "cast":
                dt, x = n.out.type.dtype, vals[n.args[0]]
                narrowing = DTYPE_BYTES[dt] < DTYPE_BYTES[width[n.args[0]]]
                vals[n.out.name] = round_to(x, dt) if rounded and narrowing else x
            elif op_info(n.op).category is Category.UNARY:
                vals[n.out.name] = float(dom.unary(n.op, vals[n.args[0]]))
            elif op_info(n.op).category is Category.BINARY:
                vals[n.out.name] = float(dom.binary(n.op, vals[n.args[0]], vals[n.args[1]]))
        if n.out.name in vals:
            width[n.out.name] = n.out.type.dtype
    return vals


def held_constants(graph: KernelGraph) -> KernelGraph:
    """``graph`` with each narrowing cast of a constant folded into the rounded constant, and each
    16-bit const at its 16-bit value (module docstring); the same graph where nothing rounds. A value
    its dtype cannot hold (overflow to ±inf) is left as written."""
    def fold(nodes):
        vals = constant_values(nodes, rounded=True)
        out, changed = [], False
        for n in nodes:
            v = vals.get(n.outs[0].name) if n.op in ("cast", "const") else None
            if v is not None and math.isfinite(v) and v != (vals[n.args[0]] if n.args else float(n.attr("value"))):
                n = Node("const", (), n.outs, make_attrs(dtype=n.out.type.dtype, value=v))
                changed = True
            out.append(n)
        return tuple(out), changed

    nodes, changed = fold(graph.nodes)
    blocks = []
    for n in nodes:
        if n.block is not None:
            inner, c = fold(n.block.nodes)
            if c:
                n, changed = replace(n, block=replace(n.block, nodes=inner)), True
        blocks.append(n)
    return replace(graph, nodes=tuple(blocks)) if changed else graph
