"""The axioms the normal form decides, kept as data: each is a pair of small Lax programs.

``nf.NFStore`` builds these rules into its normal form, so the search never saturates an e-graph;
this table states them and ``tests/superopt/abstract/test_abstract.py`` proves each one holds (both sides
normalise to the same expression) and that the oracle accepts each side's parts. The split-sum
axiom (Σ_k = Σ_tiles Σ_in-tile) involves tiling, so its check lives with the block search tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..lax import Program, T

Side = Callable[[Program, dict], T]


@dataclass(frozen=True)
class Axiom:
    name: str
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    lhs: Side
    rhs: Side


_MN = (("a", (5, 7)), ("b", (5, 7)), ("c", (5, 7)))
_MAT = (("x", (3, 6)), ("w", (6, 4)), ("r", (3, 1)))

AXIOMS: tuple[Axiom, ...] = (
    Axiom("add_comm", _MN, lambda p, v: p.add(v["a"], v["b"]), lambda p, v: p.add(v["b"], v["a"])),
    Axiom("mul_comm", _MN, lambda p, v: p.mul(v["a"], v["b"]), lambda p, v: p.mul(v["b"], v["a"])),
    Axiom("add_assoc", _MN, lambda p, v: p.add(p.add(v["a"], v["b"]), v["c"]),
          lambda p, v: p.add(v["a"], p.add(v["b"], v["c"]))),
    Axiom("mul_assoc", _MN, lambda p, v: p.mul(p.mul(v["a"], v["b"]), v["c"]),
          lambda p, v: p.mul(v["a"], p.mul(v["b"], v["c"]))),
    Axiom("distribute", _MN, lambda p, v: p.mul(p.add(v["a"], v["b"]), v["c"]),
          lambda p, v: p.add(p.mul(v["a"], v["c"]), p.mul(v["b"], v["c"]))),
    Axiom("div_mul", _MN, lambda p, v: p.mul(p.div(v["a"], v["b"]), v["c"]),
          lambda p, v: p.div(p.mul(v["a"], v["c"]), v["b"])),
    Axiom("div_div", _MN, lambda p, v: p.div(p.div(v["a"], v["b"]), v["c"]),
          lambda p, v: p.div(v["a"], p.mul(v["b"], v["c"]))),
    Axiom("exp_add", _MN, lambda p, v: p.exp(p.add(v["a"], v["b"])),
          lambda p, v: p.mul(p.exp(v["a"]), p.exp(v["b"]))),
    Axiom("square_mul", _MN, lambda p, v: p.square(v["a"]), lambda p, v: p.mul(v["a"], v["a"])),
    # (a·c)/b with b depending only on rows: the division moves after the matmul.
    Axiom("row_div_after_matmul", _MAT, lambda p, v: p.matmul(p.div(v["x"], v["r"]), v["w"]),
          lambda p, v: p.div(p.matmul(v["x"], v["w"]), v["r"])),
    Axiom("row_scale_after_matmul", _MAT, lambda p, v: p.matmul(p.mul(v["x"], p.exp(v["r"])), v["w"]),
          lambda p, v: p.mul(p.matmul(v["x"], v["w"]), p.exp(v["r"]))),
    Axiom("sum_of_matmul_sum", _MAT, lambda p, v: p.sum(p.matmul(v["x"], v["w"]), -1, True),
          lambda p, v: p.matmul(v["x"], p.sum(v["w"], -1, True))),
    Axiom("matmul_distribute", (("x", (3, 6)), ("w", (6, 4)), ("u", (6, 4))),
          lambda p, v: p.matmul(v["x"], p.add(v["w"], v["u"])),
          lambda p, v: p.add(p.matmul(v["x"], v["w"]), p.matmul(v["x"], v["u"]))),
    # Σ_i c = n·c (a sum of a term free of the summed index): LayerNorm's variance, centred or
    # expanded, is one normal form (issue 27).
    Axiom("centred_variance", (("x", (5, 7)),),
          lambda p, v: p.mean(p.square(p.sub(v["x"], p.mean(v["x"], -1, True))), -1, True),
          lambda p, v: p.sub(p.mean(p.square(v["x"]), -1, True), p.square(p.mean(v["x"], -1, True)))),
    Axiom("matmul_assoc", (("x", (3, 6)), ("a", (6, 2)), ("b", (2, 4))),
          lambda p, v: p.matmul(p.matmul(v["x"], v["a"]), v["b"]),
          lambda p, v: p.matmul(v["x"], p.matmul(v["a"], v["b"]))),
)


def axiom_program(ax: Axiom, side: str):
    """One side of an axiom as a Lax program (both sides share input names and index ids)."""
    p = Program(f"{ax.name}_{side}")
    v = {name: p.input(name, shape, "float32") for name, shape in ax.inputs}
    p.output((ax.lhs if side == "lhs" else ax.rhs)(p, v))
    return p.build()
