"""check_equivalent: accepts the fused RMSNorm→matmul and online softmax, rejects planted bugs,
and one trial misses a wrong candidate no more often than its stated bound."""
from __future__ import annotations

import math

import numpy as np
import pytest

from superopt.interp import evaluate
from superopt.interp.field_domain import FieldDomain
from superopt.lax import Program
from superopt.verify import check_equivalent, default_field, small_field, trial_bound

from tests.fixtures.graphs import (RMSNORM_MUTANTS, SOFTMAX_MUTANTS, online_softmax_av, rmsnorm_matmul,
                     rmsnorm_matmul_program, softmax_av_program)

SHAPES = [(3, 96, 80, 4, 3), (3, 75, 56, 7, 5)]  # (B, K, N, grid_y, forloop): odd sizes


@pytest.mark.parametrize("b, k, n, gy, fl", SHAPES)
def test_rmsnorm_matmul_accepted(b, k, n, gy, fl):
    v = check_equivalent(rmsnorm_matmul_program(b, k, n), rmsnorm_matmul(b, k, n, gy, fl))
    assert v.equivalent and v.trials_run == 8 and v.counterexample is None
    assert v.error_bound < 1e-30 and v.error_bound == pytest.approx(v.per_trial_bound ** 8)
    assert v.float_rel_error < 1e-13
    line = str(v)
    assert line.startswith(f"equivalent: 8 trials over Z_p (p={default_field().p}, q={default_field().q})")
    assert "error bound" in line and "float64 rel err" in line and line.endswith(" s")


@pytest.mark.parametrize("mutant", RMSNORM_MUTANTS)
def test_rmsnorm_matmul_mutants_rejected(mutant):
    b, k, n, gy, fl = (4, 96, 16, 4, 3) if mutant == "wrong_omap" else SHAPES[0]
    if mutant == "off_by_one_fmap":  # the x tile is never walked: the graph is already invalid
        with pytest.raises(Exception, match="does not change with the for-loop"):
            rmsnorm_matmul(b, k, n, gy, fl, mutant)
        return
    v = check_equivalent(rmsnorm_matmul_program(b, k, n), rmsnorm_matmul(b, k, n, gy, fl, mutant))
    assert not v.equivalent
    if mutant == "wrong_omap" and v.counterexample is None:
        assert "shape" in v.reason
        return
    trial, out, pos = v.counterexample
    assert trial == 0 and out == 0 and len(pos) == 2
    assert v.reason == f"output 0 differs at index {pos} in trial 0"
    assert str(v).startswith("not equivalent: output 0 differs")


def test_online_softmax_accepted_and_mutants_rejected():
    prog = softmax_av_program(5, 24, 7)
    ok = check_equivalent(prog, online_softmax_av(5, 24, 7, 4))
    assert ok.equivalent and ok.error_bound < 1e-20, ok
    for mutant in SOFTMAX_MUTANTS:
        v = check_equivalent(prog, online_softmax_av(5, 24, 7, 4, mutant))
        assert not v.equivalent and v.counterexample[0] == 0, (mutant, v)


def test_order_model_would_miss_missing_rescale():
    """Why max is a multiset function by default: under a random total order the missing-rescale
    bug is invisible whenever every row's maximum falls in the first chunk (≈ 1/forloop per row)."""
    f = default_field()
    prog, bad = softmax_av_program(1, 16, 3), online_softmax_av(1, 16, 3, 2, "missing_rescale")
    missed = {"order": 0, "multiset": 0}
    for seed in range(60):
        for model in missed:
            dom = FieldDomain(f.p, f.q, f.g, seed=seed, max_model=model)
            rng = np.random.default_rng(seed)
            xs = {v.name: dom.random_input(rng, v.type.shape, "f") for v in prog.inputs}
            missed[model] += np.array_equal(evaluate(prog, xs, dom)[0].p, evaluate(bad, xs, dom)[0].p)
    assert 15 <= missed["order"] <= 45 and missed["multiset"] == 0, missed


def test_float_check_catches_what_the_field_cannot():
    """Constants 1 and p + 1 are the same residue mod p; float64 tells them apart."""
    p = default_field().p

    def scaled(c: float):
        prog = Program("scale")
        x = prog.input("x", (3, 5))
        prog.output(prog.mul(x, prog.const(c)))
        return prog.build()

    v = check_equivalent(scaled(1.0), scaled(float(p + 1)))
    assert not v.equivalent and v.counterexample is None and v.trials_run == 8
    assert v.reason.startswith("float64 check: relative error") and v.float_rel_error > 1e8
    assert check_equivalent(scaled(1.0), scaled(float(p + 1)), float_check=False).equivalent


def test_inputs_must_match():
    a = rmsnorm_matmul_program(3, 96, 80)
    prog = Program("other")
    x = prog.input("x", (3, 96))
    w = prog.input("w", (96, 81))
    prog.output(prog.matmul(x, w))
    with pytest.raises(ValueError, match=r"%w: \(\(96, 80\), 'float32'\) vs \(\(96, 81\), 'float32'\)"):
        check_equivalent(a, prog.build())


def _pair(lhs, rhs, n: int = 1):
    """Two one-op programs over inputs x, y of shape [n]: lhs(p, x, y) vs rhs(p, x, y)."""
    out = []
    for f in (lhs, rhs):
        p = Program("tiny")
        x, y = p.input("x", (n,)), p.input("y", (n,))
        p.output(f(p, x, y))
        out.append(p.build())
    return out


TINY = {  # name: (program, wrong candidate, exact one-trial miss probability as f(p, q))
    "x*y vs x*x": (lambda p, x, y: p.mul(x, y), lambda p, x, y: p.mul(x, x),
                   lambda P, Q: (2 * P - 1) / P**2),
    "exp(x)exp(y) vs exp(2x)": (lambda p, x, y: p.mul(p.exp(x), p.exp(y)), lambda p, x, y: p.exp(p.add(x, x)),
                                lambda P, Q: 1 / Q),
    "x/y vs y/x": (lambda p, x, y: p.div(x, y), lambda p, x, y: p.div(y, x), None),
    "silu(x)*y vs silu(y)*x": (lambda p, x, y: p.mul(p.silu(x), y), lambda p, x, y: p.mul(p.silu(y), x), None),
}


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("pq", [(11, 5), (23, 11), (47, 23)])
def test_single_trial_miss_rate_within_bound(name, pq):
    """Measure how often ONE trial misses a wrong one-element candidate in a tiny field; the rate
    must stay under the stated per-trial bound (plus 4 binomial standard deviations)."""
    field = small_field(*pq)
    lhs, rhs, exact = TINY[name]
    prog, bad = _pair(lhs, rhs)
    eps = trial_bound(prog, bad, field.p, field.q)
    n = 600
    missed = sum(check_equivalent(prog, bad, trials=1, seed=s, float_check=False, field=field).equivalent
                 for s in range(n))
    rate = missed / n
    slack = 4 * math.sqrt(max(eps, 1 / n) * (1 - min(eps, 0.999)) / n)
    assert rate <= eps + slack, (name, field, rate, eps)
    if exact is not None:  # and the measurement itself is right, so the test could fail
        want = exact(field.p, field.q)
        assert abs(rate - want) <= 4 * math.sqrt(want * (1 - want) / n) + 1 / n, (rate, want)
        assert eps < 1 or pq == (11, 5)


def test_degree_analysis_counts_every_atom_of_a_cone():
    """The bound is only sound if the counts cover the distinct atoms an output element depends on:
    softmax(s)[i] @ v reads S exps, S max arguments and S divisions; RMSNorm → matmul one rsqrt."""
    from superopt.verify import output_degrees
    s = 24
    (soft,) = output_degrees(softmax_av_program(5, s, 7))
    u, e, v = soft.counts
    assert s <= e <= 2 * s and s <= u <= 2 * s and s <= v <= 2 * s and soft.de == 1
    (fused,) = output_degrees(online_softmax_av(5, s, 7, 4))
    assert fused.counts[1] >= s and fused.counts[0] >= s
    (rms,) = output_degrees(rmsnorm_matmul_program(3, 96, 80))
    # rsqrt is 1/sqrt (interp/canonical.py): one sqrt atom and a second division besides the
    # mean's; the row's divisor is shared by the 96 terms of the matmul, so it counts once (ds).
    assert rms.counts == (1, 0, 2) and rms.du == 2 and rms.dv == 1
    assert (rms.n, rms.d) == (2, 1)


def test_stable_softmax_equals_plain_softmax():
    """exp(x − m)/Σ exp(x − m) = exp(x)/Σ exp(x) whatever m is: the max model must not break it."""
    graphs = []
    for stable in (False, True):
        p = Program("softmax")
        x = p.input("x", (3, 17))
        p.output(p.softmax(x, dim=-1, stable=stable))
        graphs.append(p.build())
    assert check_equivalent(*graphs).equivalent
    p = Program("shifted")  # but a shift that is not the same on the whole row changes the result
    x = p.input("x", (3, 17))
    e = p.exp(p.sub(x, p.max(x, dim=0, keepdim=True)))
    p.output(p.div(e, p.sum(e, dim=-1, keepdim=True)))
    v = check_equivalent(graphs[0], p.build())
    assert not v.equivalent and v.counterexample is not None
