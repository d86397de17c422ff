"""Degree analysis: bounds, per output element, on what the error bound of a trial depends on.

``DegreeDomain`` is one more Domain for ``interp.evaluate``: a value is a shape plus a ``Deg``
summary that holds for *every* element of the tensor. Running both graphs through the same
interpreter that runs the trials means the analysis follows the tiling (grid, for-loop,
accumulators, cross-block sums) exactly as evaluated, with no second reading of the semantics.

An element is viewed as a rational function N/Den over *atoms*: input variables, uninterpreted
function (UF) results, max results and exp results, each of degree 1. ``Deg`` records
  n, d    upper bounds on deg N and deg Den;
  u, e, v the atoms in the element's cone, counted with multiplicity: opaque arguments (UF
          arguments and the elements of every max multiset), exp applications, divisions;
  du, de, dv  the largest n + d of an opaque argument, of an exponent, and the largest numerator
          degree of a divisor.
Rules: a + b → (max(n_a + d_b, n_b + d_a), d_a + d_b); a·b → (n_a + n_b, d_a + d_b);
a / b → (n_a + d_b, d_a + n_b); a sum of k terms → (n + (k−1)·d, k·d); counts add up over the
operands and multiply by k in a sum or a matmul of inner size k.

Shared denominators (issue 27: rsqrt is 1/sqrt, ``interp/canonical.py``). ``ds`` ≤ d bounds the
degree of a factor of Den common to every element along the last axis (a row's rsqrt broadcast
over its columns). A sum of k terms over the last axis, or a matmul's k terms whose left operand
has ``ds``, puts that factor over the sum once: (n + (k−1)(d − ds), ds + k(d − ds)), not
(n + (k−1)d, k·d). Sums, products and quotients add the ``ds`` of their operands; a broadcast
operand's whole denominator (and, as a divisor, its whole numerator) is shared; anything else
forgets it (``ds`` = 0 is always sound).

Sharing along the last axis. Counts are split into ``own`` (atoms that differ along the value's
last axis) and ``shared`` (atoms constant along it: an operand broadcast from extent 1, like a
row's sum or rms). A sum over the last axis multiplies ``own`` only: softmax(s) @ v counts the
row's exps and their sum once each (2·S atoms), not S·(S+1). Where the last axis is moved or
reshaped the two parts are merged (conservative).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import comb, prod

import numpy as np

from ..interp import evaluate
from ..interp.canonical import expand
from ..ir import OPAQUE_OPS, KernelGraph

Counts = tuple[int, int, int]  # (opaque arguments, exps, divisions)
ZERO: Counts = (0, 0, 0)
U, E, DIV = (1, 0, 0), (0, 1, 0), (0, 0, 1)


def _add(*cs: Counts) -> Counts:
    return tuple(sum(c[i] for c in cs) for i in range(3))  # type: ignore[return-value]


def _scale(c: Counts, k: int) -> Counts:
    return (c[0] * k, c[1] * k, c[2] * k)


@dataclass(frozen=True)
class Deg:
    n: int = 0
    d: int = 0
    own: Counts = ZERO
    shared: Counts = ZERO
    du: int = 0
    de: int = 0
    dv: int = 0
    ds: int = 0   # degree of a denominator factor shared along the last axis (docstring)

    @property
    def counts(self) -> Counts:
        return _add(self.own, self.shared)

    def merged(self) -> "Deg":
        """Forget which atoms are constant along the last axis."""
        return replace(self, own=self.counts, shared=ZERO, ds=0)

    def as_shared(self) -> "Deg":
        """Broadcast along the last axis: every atom is now constant along it."""
        return replace(self, own=ZERO, shared=self.counts, ds=self.d)

    def args_max(self, other: "Deg") -> dict:
        return dict(du=max(self.du, other.du), de=max(self.de, other.de), dv=max(self.dv, other.dv))


@dataclass(frozen=True)
class DValue:
    shape: tuple[int, ...]
    deg: Deg


def _last(shape: tuple[int, ...]) -> int:
    return shape[-1] if shape else 1


def _aligned(x: DValue, out: tuple[int, ...]) -> Deg:
    """An operand's summary inside a result of shape ``out`` (numpy broadcasting)."""
    return x.deg.as_shared() if _last(x.shape) == 1 and _last(out) > 1 else x.deg


class DegreeDomain:
    """Evaluates shapes and ``Deg`` summaries instead of numbers (see the module docstring)."""

    name = "degree"

    def __init__(self):
        # Whole-graph counts of atoms computed (each element once; replicated work is computed once
        # by the vectorised interpreter): another upper bound on the distinct atoms of any cone.
        self.total: Counts = ZERO

    def _computed(self, what: Counts, shape: tuple[int, ...]) -> None:
        self.total = _add(self.total, _scale(what, prod(shape)))

    def const(self, value, dtype):
        return DValue((), Deg())

    def unary(self, op, x: DValue) -> DValue:
        g = x.deg
        if op == "neg":
            return x
        if op == "square":
            return DValue(x.shape, replace(g, n=2 * g.n, d=2 * g.d, ds=2 * g.ds))
        if op == "exp":
            self._computed(E, x.shape)
            return DValue(x.shape, replace(g, n=1, d=0, ds=0, own=_add(g.own, E), de=max(g.de, g.n + g.d)))
        # ---- identities between opaque ops (issue 27, search-ops): the field test's rewrites
        rewritten = expand(self, op, x)
        if rewritten is not None:
            return rewritten
        # ---- end of the identities block
        if op in OPAQUE_OPS:
            self._computed(U, x.shape)
            return DValue(x.shape, replace(g, n=1, d=0, ds=0, own=_add(g.own, U), du=max(g.du, g.n + g.d)))
        raise ValueError(f"DegreeDomain: no unary op {op!r}")

    def binary(self, op, a: DValue, b: DValue) -> DValue:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        x, y = _aligned(a, shape), _aligned(b, shape)
        own, shared, args = _add(x.own, y.own), _add(x.shared, y.shared), x.args_max(y)
        ds = x.ds + y.ds
        if op in ("add", "sub"):
            return DValue(shape, Deg(max(x.n + y.d, y.n + x.d), x.d + y.d, own, shared, ds=ds, **args))
        if op == "mul":
            return DValue(shape, Deg(x.n + y.n, x.d + y.d, own, shared, ds=ds, **args))
        if op == "div":
            self._computed(DIV, shape)
            args["dv"] = max(args["dv"], y.n)
            y_bcast = _last(b.shape) == 1 and _last(shape) > 1  # the divisor's numerator is shared too
            return DValue(shape, Deg(x.n + y.d, x.d + y.n, _add(own, DIV), shared,
                                     ds=x.ds + (y.n if y_bcast else 0), **args))
        if op == "max":  # a max atom over the multiset {a, b}
            self._computed(_scale(U, 2), shape)
            args["du"] = max(args["du"], x.n + x.d, y.n + y.d)
            return DValue(shape, Deg(1, 0, _add(own, _scale(U, 2)), shared, **args))
        raise ValueError(f"DegreeDomain: no binary op {op!r}")

    def reduce(self, op, x: DValue, axis, keepdim) -> DValue:
        k = x.shape[axis]
        shape = list(x.shape)
        if keepdim:
            shape[axis] = 1
        else:
            del shape[axis]
        g = x.deg
        if op == "reduce_max" and k == 1:  # the max of one element is the element (FieldDomain agrees)
            return DValue(tuple(shape), g)
        if axis == len(x.shape) - 1:  # atoms shared along the summed axis count once
            own, shared = _add(_scale(g.own, k), g.shared), ZERO
        else:
            own, shared = _scale(g.own, k), _scale(g.shared, k)
        if op == "reduce_sum":
            if axis == len(x.shape) - 1:  # the shared denominator is common to the k terms
                free = g.d - g.ds
                return DValue(tuple(shape), replace(g, n=g.n + (k - 1) * free, d=g.ds + k * free, ds=0,
                                                    own=own, shared=shared))
            return DValue(tuple(shape), replace(g, n=g.n + (k - 1) * g.d, d=k * g.d, ds=k * g.ds,
                                                own=own, shared=shared))
        self._computed(U, x.shape)
        return DValue(tuple(shape), replace(g, n=1, d=0, ds=0, own=_add(own, _scale(U, k)), shared=shared,
                                            du=max(g.du, g.n + g.d)))

    def matmul(self, a: DValue, b: DValue) -> DValue:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        k = a.shape[-1]
        x, y = a.deg, b.deg
        # a is summed along its last axis and constant along the result's last axis (b's columns)
        shared = _add(_scale(x.own, k), x.shared, _scale(y.shared, k))
        own = _scale(y.own, k)
        # a's denominator shared along its last axis (k) is common to the k terms; the result's
        # shared part is everything of a (constant along b's columns) and b's shared part.
        c = x.ds
        n, free = x.n + y.n, x.d + y.d - c
        return DValue(batch + (a.shape[-2], b.shape[-1]),
                      Deg(n + (k - 1) * free, c + k * free, own, shared, ds=c + k * (x.d - c) + k * y.ds,
                          **x.args_max(y)))

    def cast(self, x, dtype):
        return x

    def shape(self, x: DValue):
        return x.shape

    def reshape(self, x: DValue, shape):
        shape = tuple(shape)
        if prod(shape) != prod(x.shape):
            raise ValueError(f"DegreeDomain: cannot reshape {list(x.shape)} to {list(shape)}")
        same_last = bool(shape) and bool(x.shape) and shape[-1] == x.shape[-1]  # row-major: same index
        return DValue(shape, x.deg if same_last else x.deg.merged())

    def permute(self, x: DValue, axes):
        keeps_last = not axes or axes[-1] == len(axes) - 1
        return DValue(tuple(x.shape[a] for a in axes), x.deg if keeps_last else x.deg.merged())

    def concat(self, xs, axis):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        degs = [x.deg.merged() if axis == len(shape) - 1 else x.deg for x in xs]
        top = lambda f: max(getattr(g, f) for g in degs)  # noqa: E731
        own = tuple(max(g.own[i] for g in degs) for i in range(3))
        shared = tuple(max(g.shared[i] for g in degs) for i in range(3))
        return DValue(tuple(shape), Deg(top("n"), top("d"), own, shared, top("du"), top("de"), top("dv")))

    def slice(self, x: DValue, axis, start, stop):
        shape = list(x.shape)
        shape[axis] = stop - start
        return DValue(tuple(shape), x.deg)

    def broadcast_to(self, x: DValue, shape):
        return DValue(tuple(shape), _aligned(x, tuple(shape)))


def output_degrees(graph: KernelGraph) -> list[Deg]:
    """One ``Deg`` per output of ``graph``, valid for each of its elements.

    Cone counts (with multiplicity) and whole-graph counts (without) both bound the distinct atoms
    in a cone; each count is the smaller of the two.
    """
    dom = DegreeDomain()
    inputs = {v.name: DValue(v.type.shape, Deg(n=1)) for v in graph.inputs}
    outs = [v.deg.merged() for v in evaluate(graph, inputs, dom)]
    return [replace(g, own=tuple(min(c, t) for c, t in zip(g.own, dom.total))) for g in outs]


def trial_bound(program: KernelGraph, candidate: KernelGraph, p: int, q: int) -> float:
    """The per-trial bound ε of ``superopt.verify.equivalence`` (its docstring derives it)."""
    worst = 0.0
    for a, b in zip(output_degrees(program), output_degrees(candidate)):
        u, e, v = _add(a.counts, b.counts)
        eps = ((a.n + a.d + b.n + b.d) / p                       # Schwartz–Zippel in Z_p
               + comb(u, 2) * 2 * max(a.du, b.du) / p           # two opaque arguments merge
               + v * max(a.dv, b.dv) * (1 / p + 1 / q)          # a divisor vanishes
               + comb(e, 2) * 2 * max(a.de, b.de) / q           # two exponents merge in Z_q
               + u * 2.0**-32)                                  # hash bias (mod p of 64 bits)
        worst = max(worst, eps)
    return min(1.0, worst)
