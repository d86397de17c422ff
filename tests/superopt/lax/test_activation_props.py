"""Property: random compositions of the norm and activation ops (issue 27) round-trip through the
text form, evaluate in float64 like an independent numpy reference (≤ 1e-12), and verify against
the same composition spelled with the written-out identities (interp/canonical.py)."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superopt.interp import NumpyDomain, evaluate
from superopt.ir import from_text, to_text
from superopt.lax import Program
from superopt.lax.activations import gelu_tanh_written, softcap
from superopt.verify import check_equivalent

ROWS, D = 3, 7
_erf = np.vectorize(math.erf, otypes=[np.float64])
K = math.sqrt(2.0 / math.pi)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _c(p, v):
    return p.const(v, "float32")


def _ln_written(p, x, w, b, offset):
    """LayerNorm with 1/sqrt instead of rsqrt and the mean written out as a sum over n."""
    mu = p.div(p.sum(x, -1, True), _c(p, D))
    cen = p.sub(x, mu)
    y = p.div(cen, p.sqrt(p.add(p.div(p.sum(p.square(cen), -1, True), _c(p, D)), _c(p, 1e-5))))
    y = p.mul(y, p.add(w, _c(p, offset)) if offset else w)
    return p.add(y, b)


def _ln_ref(x, w, b, offset):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * (w + offset) + b


# name -> (program form, written-out form, numpy reference); each maps (p, x, v) / (x, v) to a value
STEPS = {
    "gelu": (lambda p, x, v: p.gelu(x),
             lambda p, x, v: p.mul(p.mul(_c(p, 0.5), x), p.add(_c(p, 1.0), p.erf(p.div(x, _c(p, math.sqrt(2.0)))))),
             lambda x, v: 0.5 * x * (1 + _erf(x / math.sqrt(2.0)))),
    "gelu_tanh": (lambda p, x, v: p.gelu_tanh(x), lambda p, x, v: gelu_tanh_written(p, x),
                  lambda x, v: 0.5 * x * (1 + np.tanh(K * (x + 0.044715 * x**3)))),
    "relu": (lambda p, x, v: p.relu(x), lambda p, x, v: p.relu(x), lambda x, v: np.maximum(x, 0)),
    "relu2": (lambda p, x, v: p.activation("relu2", x), lambda p, x, v: p.mul(p.relu(x), p.relu(x)),
              lambda x, v: np.maximum(x, 0) ** 2),
    "quick_gelu": (lambda p, x, v: p.activation("quick_gelu", x),
                   lambda p, x, v: p.div(p.mul(x, p.sigmoid(p.mul(_c(p, 1.702), x))), _c(p, 1.0)),
                   lambda x, v: x * _sig(1.702 * x)),
    "silu": (lambda p, x, v: p.silu(x), lambda p, x, v: p.mul(p.sigmoid(x), x), lambda x, v: x * _sig(x)),
    "softcap": (lambda p, x, v: softcap(p, x, 5.0),
                lambda p, x, v: p.mul(_c(p, 5.0), p.sub(p.mul(_c(p, 2.0), p.sigmoid(p.mul(p.div(x, _c(p, 5.0)),
                                                                                     _c(p, 2.0)))), _c(p, 1.0))),
                lambda x, v: 5.0 * np.tanh(x / 5.0)),
    "erf": (lambda p, x, v: p.erf(x), lambda p, x, v: p.erf(x), lambda x, v: _erf(x)),
    "layer_norm": (lambda p, x, v: p.layer_norm(x, v["w"], v["b"]),
                   lambda p, x, v: _ln_written(p, x, v["w"], v["b"], 0),
                   lambda x, v: _ln_ref(x, v["w"], v["b"], 0)),
    "layernorm1p": (lambda p, x, v: p.layer_norm(x, v["w"], v["b"], offset=1.0),
                    lambda p, x, v: _ln_written(p, x, v["w"], v["b"], 1.0),
                    lambda x, v: _ln_ref(x, v["w"], v["b"], 1.0)),
    "mul_y": (lambda p, x, v: p.mul(x, v["y"]), lambda p, x, v: p.mul(v["y"], x), lambda x, v: x * v["y"]),
    "add_y": (lambda p, x, v: p.add(x, v["y"]), lambda p, x, v: p.add(v["y"], x), lambda x, v: x + v["y"]),
}


def _build(steps, form: int):
    p = Program("composition")
    v = {"x": p.input("x", (ROWS, D)), "y": p.input("y", (ROWS, D)), "w": p.input("w", (D,)),
         "b": p.input("b", (D,))}
    h = v["x"]
    for s in steps:
        h = STEPS[s][form](p, h, v)
    p.output(h)
    return p.build()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=5), st.integers(0, 2**16))
def test_random_compositions_round_trip_evaluate_and_verify(steps, seed):
    g = _build(steps, 0)
    assert from_text(to_text(g)) == g
    rng = np.random.default_rng(seed)
    vals = {"x": rng.standard_normal((ROWS, D)), "y": rng.standard_normal((ROWS, D)),
            "w": rng.standard_normal(D), "b": rng.standard_normal(D)}
    (got,) = evaluate(g, vals, NumpyDomain())
    ref = vals["x"]
    for s in steps:
        ref = STEPS[s][2](ref, vals)
    assert np.linalg.norm(got - ref) <= 1e-12 * max(np.linalg.norm(ref), 1.0)
    v = check_equivalent(g, _build(steps, 1), trials=3, seed=seed)
    assert v.equivalent, f"{steps}: {v}"
