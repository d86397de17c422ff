"""FieldDomain algebra: exact limb matmul, exp homomorphism, max as a symmetric function, UF consistency."""
from __future__ import annotations

import numpy as np
import pytest

from superopt.interp.field_domain import FieldDomain, FieldValue, matmul_mod
from superopt.verify import default_field, make_field, small_field

F = default_field()


def exact_matmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Python-int matmul mod m (object arrays: no overflow, no rounding)."""
    return np.matmul(a.astype(np.int64).astype(object), b.astype(np.int64).astype(object)) % m


def dom(seed: int = 0, field=F, **kw) -> FieldDomain:
    return FieldDomain(field.p, field.q, field.g, seed=seed, **kw)


@pytest.mark.parametrize("shape_a, shape_b", [
    ((3, 73), (73, 5)),            # odd sizes
    ((2, 1, 7, 33), (3, 33, 6)),   # batch broadcasting of leading grid / batch dims
    ((1, 4, 1, 5, 64), (4, 1, 1, 64, 9)),
    ((5, 4096), (4096, 7)),        # K = 4096: the 16-bit-limb case of the brief
    ((2, 300), (300, 1)),
])
def test_matmul_matches_python_int(shape_a, shape_b):
    rng = np.random.default_rng(7)
    for m in (F.p, F.q, 11):
        a = rng.integers(0, m, size=shape_a)
        b = rng.integers(0, m, size=shape_b)
        assert np.array_equal(matmul_mod(a, b, m), exact_matmul(a, b, m))
        # float64 storage of the operands (random inputs are drawn that way) gives the same result
        assert np.array_equal(matmul_mod(a.astype(np.float64), b, m), exact_matmul(a, b, m))


def test_matmul_worst_case_residues_and_long_k():
    """All residues p − 1 maximise every partial sum: exactness is tight there; K ≥ 2^14 goes by chunks."""
    for k in (4096, 14336, 20000):
        a = np.full((2, k), F.p - 1)
        b = np.full((k, 3), F.p - 1)
        assert np.array_equal(matmul_mod(a, b, F.p), exact_matmul(a, b, F.p))


def test_matmul_through_domain_pairs_p_and_q():
    d = dom()
    rng = np.random.default_rng(1)
    a, b = d.random_input(rng, (4, 96), "float32"), d.random_input(rng, (96, 3), "float32")
    r = d.matmul(a, b)
    assert np.array_equal(r.p, exact_matmul(a.p, b.p, F.p))
    assert np.array_equal(r.q, exact_matmul(a.q, b.q, F.q))


def test_random_inputs_are_residues_and_not_constant():
    d = dom()
    x = d.random_input(np.random.default_rng(2), (50, 40), "bfloat16")
    assert x.p.min() >= 0 and x.p.max() < F.p and x.q.min() >= 0 and x.q.max() < F.q
    assert len(np.unique(x.p)) > 1900 and np.array_equal(x.p, np.floor(x.p))


def test_exp_is_a_homomorphism_from_zq():
    d = dom()
    rng = np.random.default_rng(3)
    a, b = d.random_input(rng, (64,), "f"), d.random_input(rng, (64,), "f")
    lhs = d.unary("exp", d.binary("add", a, b))
    rhs = d.binary("mul", d.unary("exp", a), d.unary("exp", b))
    assert np.array_equal(lhs.p, rhs.p)
    # exp(a − a) = 1 and exp is g^(a mod q): check one element by Python's pow
    assert np.all(d.unary("exp", d.binary("sub", a, a)).p == 1)
    assert d.unary("exp", a).p[5] == pow(F.g, int(a.q[5]), F.p)
    # exp of distinct exponents differ (g has order q)
    assert len(np.unique(d.unary("exp", a).p)) == len(np.unique(a.q))


def test_division_and_constants_are_exact_rationals():
    d = dom()
    x = d.random_input(np.random.default_rng(4), (32,), "f")
    x.p[0] = 0.0  # 0⁻¹ is defined as 0
    y = d.binary("mul", d.binary("div", x, d.const(3.0, "f")), d.const(3.0, "f"))
    assert np.array_equal(y.p, x.p.astype(np.int64))
    one = d.binary("div", x, x).p
    assert one[0] == 0 and np.all(one[1:] == 1)
    eps = d.const(1e-6, "f")  # the float's exact dyadic value num / 2^k
    from fractions import Fraction
    fr = Fraction(1e-6)
    assert int(eps.p) * fr.denominator % F.p == fr.numerator % F.p
    assert int(d.const(-0.5, "f").p) * 2 % F.p == F.p - 1


def test_uninterpreted_functions_consistent_and_keyed():
    rng = np.random.default_rng(5)
    d1, d2 = dom(seed=1), dom(seed=2)
    x = d1.random_input(rng, (100,), "f")
    twice = FieldValue(np.concatenate([x.p, x.p]), np.concatenate([x.q, x.q]))
    for op in ("rsqrt", "silu", "sqrt", "gelu_tanh", "sigmoid", "tanh"):
        y = d1.unary(op, twice)
        assert np.array_equal(y.p[:100], y.p[100:])                  # same argument, same value
        assert np.array_equal(d1.unary(op, x).p, y.p[:100])          # and on every call
        assert not np.array_equal(d2.unary(op, x).p, y.p[:100])      # fresh key per trial
    assert not np.array_equal(d1.unary("silu", x).p, d1.unary("sigmoid", x).p)  # fresh key per op
    assert d1.unary("rsqrt", x).p.max() < F.p


@pytest.mark.parametrize("model", ["multiset", "order"])
def test_max_is_associative_and_commutative(model):
    d = dom(seed=9, max_model=model)
    rng = np.random.default_rng(6)
    a, b, c = (d.random_input(rng, (40,), "f") for _ in range(3))
    mx = lambda u, v: d.binary("max", u, v)  # noqa: E731
    assert np.array_equal(mx(a, b).p, mx(b, a).p)
    assert np.array_equal(mx(mx(a, b), c).p, mx(a, mx(b, c)).p)
    # a reduction over a row equals the running max over its chunks (what online softmax does)
    row = d.random_input(rng, (3, 12), "f")
    full = d.reduce("reduce_max", row, 1, False)
    chunks = [d.reduce("reduce_max", d.slice(row, 1, i, i + 4), 1, False) for i in (0, 4, 8)]
    assert np.array_equal(mx(mx(chunks[0], chunks[1]), chunks[2]).p, full.p)
    # the max of a single element is that element
    one = d.slice(row, 1, 5, 6)
    assert np.array_equal(d.reduce("reduce_max", one, 1, True).p, one.p)


def test_max_models_differ_where_they_should():
    rng = np.random.default_rng(8)
    order, multiset = dom(seed=3, max_model="order"), dom(seed=3)
    row = order.random_input(rng, (5, 16), "f")
    m = order.reduce("reduce_max", row, 1, True)
    assert np.all((row.p == m.p).any(axis=1))          # random order: one of its inputs
    assert np.array_equal(order.binary("max", row, row).p, row.p)  # and idempotent
    part = multiset.reduce("reduce_max", multiset.slice(row, 1, 0, 15), 1, True)
    full = multiset.reduce("reduce_max", row, 1, True)
    assert np.all(part.p != full.p)                     # multiset: one element less changes it


def test_small_fields():
    for f in (small_field(11, 5), small_field(23, 11), make_field(1000)):
        assert (f.p - 1) % f.q == 0 and pow(f.g, f.q, f.p) == 1 and f.g != 1
        d = dom(field=f)
        a = d.random_input(np.random.default_rng(0), (6, 30), "f")
        b = d.random_input(np.random.default_rng(1), (30, 4), "f")
        assert np.array_equal(d.matmul(a, b).p, exact_matmul(a.p, b.p, f.p))
    assert default_field().p < 2**31 and default_field().q > 2**29
