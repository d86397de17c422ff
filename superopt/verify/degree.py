"""Degree analysis: bounds, per output element, on what the error bound of a trial depends on.

``DegreeDomain`` is one more Domain for ``interp.evaluate``: a value is a shape plus a ``Deg``
summary that holds for *every* element of the tensor. Running both graphs through the same
interpreter that runs the trials means the analysis follows the tiling (grid, for-loop,
accumulators, cross-block sums) exactly as evaluated, with no second reading of the semantics.

An element is viewed as a rational function N/Den over *atoms*: input variables, uninterpreted
function (UF) results, max results and exp results, each of degree 1. ``Deg`` records
  n, d   upper bounds on deg N and deg Den;
  cu     opaque arguments in the element's cone, with multiplicity (UF arguments and the elements
         of every max multiset); du, the largest n + d of any of them;
  ce     exp applications in the cone; de, the largest n + d of an exponent;
  cv     divisions in the cone; dv, the largest numerator degree of a divisor.
Rules: a + b → (max(n_a + d_b, n_b + d_a), d_a + d_b); a·b → (n_a + n_b, d_a + d_b);
a / b → (n_a + d_b, d_a + n_b); a sum of k terms → (n + (k−1)·d, k·d); every count adds up over
the operands and multiplies by k in a sum or a matmul of inner size k.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import comb, prod

import numpy as np

from ..interp import evaluate
from ..ir import OPAQUE_OPS, KernelGraph


@dataclass(frozen=True)
class Deg:
    n: int = 0
    d: int = 0
    cu: int = 0
    du: int = 0
    ce: int = 0
    de: int = 0
    cv: int = 0
    dv: int = 0

    def cone(self, other: "Deg") -> dict:
        """Counts add, argument degrees take the max: the cone of an op on two operands."""
        return dict(cu=self.cu + other.cu, du=max(self.du, other.du), ce=self.ce + other.ce,
                    de=max(self.de, other.de), cv=self.cv + other.cv, dv=max(self.dv, other.dv))

    def times(self, k: int) -> "Deg":
        """The sum of k terms like this one."""
        return Deg(self.n + (k - 1) * self.d, k * self.d, k * self.cu, self.du, k * self.ce, self.de,
                   k * self.cv, self.dv)



@dataclass(frozen=True)
class DValue:
    shape: tuple[int, ...]
    deg: Deg


class DegreeDomain:
    """Evaluates shapes and ``Deg`` summaries instead of numbers (see the module docstring)."""

    name = "degree"

    def __init__(self):
        # Whole-graph counts of atoms computed (each element once; replicated work is computed once
        # by the vectorised interpreter): another upper bound on the distinct atoms of any cone.
        self.total = {"cu": 0, "ce": 0, "cv": 0}

    def const(self, value, dtype):
        return DValue((), Deg())

    def unary(self, op, x: DValue) -> DValue:
        g = x.deg
        if op == "neg":
            return x
        if op == "square":
            return DValue(x.shape, replace(g, n=2 * g.n, d=2 * g.d))
        if op in OPAQUE_OPS or op == "exp":
            self.total["ce" if op == "exp" else "cu"] += prod(x.shape)
        if op == "exp":
            return DValue(x.shape, Deg(1, 0, cu=g.cu, du=g.du, ce=g.ce + 1, de=max(g.de, g.n + g.d),
                                       cv=g.cv, dv=g.dv))
        if op in OPAQUE_OPS:
            return DValue(x.shape, Deg(1, 0, cu=g.cu + 1, du=max(g.du, g.n + g.d), ce=g.ce, de=g.de,
                                       cv=g.cv, dv=g.dv))
        raise ValueError(f"DegreeDomain: no unary op {op!r}")

    def binary(self, op, a: DValue, b: DValue) -> DValue:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        x, y = a.deg, b.deg
        c = x.cone(y)
        if op in ("add", "sub"):
            return DValue(shape, Deg(max(x.n + y.d, y.n + x.d), x.d + y.d, **c))
        if op == "mul":
            return DValue(shape, Deg(x.n + y.n, x.d + y.d, **c))
        if op in ("div", "max"):
            self.total["cv" if op == "div" else "cu"] += prod(shape) * (1 if op == "div" else 2)
        if op == "div":
            c.update(cv=c["cv"] + 1, dv=max(c["dv"], y.n))
            return DValue(shape, Deg(x.n + y.d, x.d + y.n, **c))
        if op == "max":  # a max atom over the multiset {a, b}
            c.update(cu=c["cu"] + 2, du=max(c["du"], x.n + x.d, y.n + y.d))
            return DValue(shape, Deg(1, 0, **c))
        raise ValueError(f"DegreeDomain: no binary op {op!r}")

    def reduce(self, op, x: DValue, axis, keepdim) -> DValue:
        k = x.shape[axis]
        shape = list(x.shape)
        if keepdim:
            shape[axis] = 1
        else:
            del shape[axis]
        if op == "reduce_sum":
            return DValue(tuple(shape), x.deg.times(k))
        if k == 1:  # the max of one element is the element (FieldDomain agrees)
            return DValue(tuple(shape), x.deg)
        self.total["cu"] += prod(x.shape)
        g, summed = x.deg, x.deg.times(k)
        return DValue(tuple(shape), Deg(1, 0, cu=summed.cu + k, du=max(g.du, g.n + g.d), ce=summed.ce,
                                        de=g.de, cv=summed.cv, dv=g.dv))

    def matmul(self, a: DValue, b: DValue) -> DValue:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        x, y = a.deg, b.deg
        term = Deg(x.n + y.n, x.d + y.d, **x.cone(y))
        return DValue(batch + (a.shape[-2], b.shape[-1]), term.times(a.shape[-1]))

    def cast(self, x, dtype):
        return x

    def shape(self, x: DValue):
        return x.shape

    def reshape(self, x: DValue, shape):
        shape = tuple(shape)
        if prod(shape) != prod(x.shape):
            raise ValueError(f"DegreeDomain: cannot reshape {list(x.shape)} to {list(shape)}")
        return DValue(shape, x.deg)

    def permute(self, x: DValue, axes):
        return DValue(tuple(x.shape[a] for a in axes), x.deg)

    def concat(self, xs, axis):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        degs = [x.deg for x in xs]
        return DValue(tuple(shape), Deg(*(max(getattr(g, f) for g in degs) for f in Deg.__dataclass_fields__)))

    def slice(self, x: DValue, axis, start, stop):
        shape = list(x.shape)
        shape[axis] = stop - start
        return DValue(tuple(shape), x.deg)

    def broadcast_to(self, x: DValue, shape):
        return DValue(tuple(shape), x.deg)



def output_degrees(graph: KernelGraph) -> list[Deg]:
    """One ``Deg`` per output of ``graph``, valid for each of its elements.

    Cone counts (with multiplicity) and whole-graph counts (without) both bound the distinct atoms
    in a cone; each count is the smaller of the two.
    """
    dom = DegreeDomain()
    inputs = {v.name: DValue(v.type.shape, Deg(n=1)) for v in graph.inputs}
    outs = [v.deg for v in evaluate(graph, inputs, dom)]
    return [replace(g, **{k: min(getattr(g, k), t) for k, t in dom.total.items()}) for g in outs]


def trial_bound(program: KernelGraph, candidate: KernelGraph, p: int, q: int) -> float:
    """The per-trial bound ε of ``superopt.verify.equivalence`` (its docstring derives it)."""
    worst = 0.0
    for a, b in zip(output_degrees(program), output_degrees(candidate)):
        u, e, v = a.cu + b.cu, a.ce + b.ce, a.cv + b.cv
        eps = ((a.n + a.d + b.n + b.d) / p                       # Schwartz–Zippel in Z_p
               + comb(u, 2) * 2 * max(a.du, b.du) / p           # two opaque arguments merge
               + v * max(a.dv, b.dv) * (1 / p + 1 / q)          # a divisor vanishes
               + comb(e, 2) * 2 * max(a.de, b.de) / q           # two exponents merge in Z_q
               + u * 2.0**-32)                                  # hash bias (mod p of 64 bits)
        worst = max(worst, eps)
    return min(1.0, worst)
