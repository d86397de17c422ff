"""The abstract-expression normal form and the subexpression oracle the search prunes with."""
from __future__ import annotations

import pytest

from superopt.abstract import AXIOMS, NFStore, SubexprOracle, analyze, program_exprs
from superopt.abstract.axioms import axiom_program
from superopt.lax import Program


def _nf(g, store):
    return program_exprs(g, analyze(g), store)[g.outputs[0]]


@pytest.mark.parametrize("ax", AXIOMS, ids=lambda a: a.name)
def test_axiom_sides_share_a_normal_form(ax):
    store = NFStore()
    assert _nf(axiom_program(ax, "lhs"), store) == _nf(axiom_program(ax, "rhs"), store)


def test_distinct_programs_get_distinct_normal_forms():
    # Would fail if the normal form forgot which dims a matmul contracts, or dropped a scale.
    def prog(kind):
        p = Program(kind)
        x, w = p.input("x", (3, 6)), p.input("w", (6, 6))
        if kind == "xw":
            p.output(p.matmul(x, w))
        elif kind == "xwt":
            p.output(p.matmul(x, p.transpose(w)))
        else:
            p.output(p.mul(p.matmul(x, w), 2.0))
        return p.build()

    store = NFStore()
    assert len({_nf(prog(k), store) for k in ("xw", "xwt", "x2w")}) == 3


def _rmsnorm_target():
    p = Program("rms")
    x, w = p.input("x", (5, 96)), p.input("w", (96, 80))
    p.output(p.matmul(p.rms_norm(x, eps=1e-6), w))
    g = p.build()
    idx = analyze(g)
    store = NFStore({1: frozenset("lt")})  # index 1 (the 96-dim) walked by a for-loop
    return g, idx, store, program_exprs(g, idx, store)[g.outputs[0]]


def test_oracle_accepts_tiled_parts_and_rejects_wrong_ones():
    g, idx, s, target = _rmsnorm_target()
    oracle = SubexprOracle(s, [target], tuple(v for v, _ in idx.consts))
    x, w = s.atom("x", idx.labels["x"]), s.atom("w", idx.labels["w"])
    tile_mm = s.reduce(s.mul(x, w), ((1, "t"),))          # Σ over one tile of k
    assert oracle.query(tile_mm)
    assert oracle.query(s.reduce(tile_mm, ((1, "l"),)))   # accumulated over the loop: the whole Σ_k
    assert oracle.query(s.reduce(s.mul(x, x), ((1, "t"),)))  # a tile's sum of squares
    assert not oracle.query(s.reduce(w, ((1, "t"),)))     # Σ_k w alone: x could never join the sum
    assert not oracle.query(s.mul(x, s.mul(x, w)))        # x²·w is not part of x·w·rsqrt(…)
    assert not oracle.query(s.fn("exp", x))


def test_split_sum_normalises_to_the_whole_sum():
    _, idx, s, _ = _rmsnorm_target()
    x, w = s.atom("x", idx.labels["x"]), s.atom("w", idx.labels["w"])
    whole = s.reduce(s.mul(x, w), ((1, "*"),))
    tiled = s.reduce(s.reduce(s.mul(x, w), ((1, "t"),)), ((1, "l"),))
    assert tiled == whole
    assert s.reduce(s.mul(x, w), ((1, "t"),)) != whole
