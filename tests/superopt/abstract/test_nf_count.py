"""Σ_i c = n·c in the normal form (issue 27): a sum of a term free of the summed index."""
from __future__ import annotations

from fractions import Fraction

from superopt.abstract import ALL, NFStore, analyze, program_exprs
from superopt.lax import Program


def _exprs(build, shape=(4, 16)):
    p = Program("nf")
    x = p.input("x", shape)
    outs = build(p, x)
    p.output(*outs)
    g = p.build()
    store = NFStore()
    env = program_exprs(g, analyze(g), store)
    return store, [env[o] for o in g.outputs]


def test_the_layernorm_reproduction_normalises_to_zero():
    store, (e,) = _exprs(lambda p, x: [p.sum(p.sub(x, p.mean(x, -1, keepdim=True)), -1, keepdim=True)])
    assert e == store.ZERO


def test_a_sum_of_a_row_constant_is_the_extent_times_it():
    store, (a, b) = _exprs(lambda p, x: [p.sum(p.add(p.mul(x, 0.0), p.sum(x, -1, True)), -1, True),
                                         p.mul(p.sum(x, -1, True), p.const(16.0))], shape=(4, 16))
    assert a == b and a != store.ZERO


def test_layernorm_variance_equals_its_expanded_form():
    def both(p, x):
        d = p.sub(x, p.mean(x, -1, True))
        m = p.mean(x, -1, True)
        return [p.mean(p.square(d), -1, True), p.sub(p.mean(p.square(x), -1, True), p.square(m)),
                p.sub(p.div(p.sum(p.square(x), -1, True), p.const(11.0)), p.square(m))]  # a wrong n

    store, (centred, expanded, wrong) = _exprs(both, (3, 10))
    assert centred == expanded and centred != wrong


def test_counts_of_tile_parts_merge_into_the_whole_extent():
    s = NFStore({0: frozenset("tl")}, sizes={0: 12})
    c = s.atom("r", (1,))  # free of index 0
    tile = s.reduce(c, ((0, "t"),))
    assert "#[0:t]" in s.show(tile)  # a symbolic count of the tile part
    whole = s.reduce(tile, ((0, "l"),))
    assert whole == s.scale(c, Fraction(12))
    assert s.reduce(c, ((0, ALL),)) == whole


def test_an_unknown_extent_stays_a_count_factor():
    s = NFStore()
    c = s.atom("r", (1,))
    e = s.reduce(c, ((0, ALL),))
    assert e != c and s.free(e) == frozenset({1})
