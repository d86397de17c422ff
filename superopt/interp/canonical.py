"""The verifier's identity model: opaque activations rewritten over a few base functions.

The finite-field test treats opaque unary ops as uninterpreted functions (``field_domain``). Two
programs that use *different* opaque ops for the same real function — silu(x) against
x·sigmoid(x), rsqrt(x) against 1/sqrt(x), ``gelu_tanh`` against HF's written-out
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) — would then be told apart and the equivalent one
rejected. So before a value meets a hash, every op below is rebuilt, with the Domain's own
arithmetic, from the *base* functions ``sigmoid``, ``sqrt``, ``erf``, ``relu`` (uninterpreted)
and ``exp`` (interpreted):

    silu(x)      = x · sigmoid(x)
    rsqrt(x)     = 1 / sqrt(x)
    tanh(x)      = 2 · sigmoid(2x) − 1
    gelu_tanh(x) = x · sigmoid(2k · (x + 0.044715 · x³))      k = fl(√(2/π))
                   (= 0.5·x·(1 + tanh(k·(x + 0.044715·x³))) by the line above)
    gelu(x)      = 0.5 · x · (1 + erf(x / fl(√2)))

Each line is an identity of real functions (with the constants exactly as written, as float64
rationals), so formal equality of the rewritten terms still implies equality over the reals: the
test stays sound. A softcap c·tanh(x/c) needs no rule of its own: it is tanh, rewritten above.
What is *not* modelled (a false alarm, never a false pass): rewrites that change a constant's
float spelling (x·fl(1/√2) against x / fl(√2); gelu_fast's 0.7978845608 against fl(√(2/π))),
sigmoid(−x) = 1 − sigmoid(x), relu(x) = max(x, 0), erf's oddness. The degree analysis
(``verify.degree``) runs the same rewrites, so the error bound counts the atoms and divisions
they introduce (``verify/equivalence.py`` states the bound).
"""
from __future__ import annotations

import math
from typing import Any

BASE_FUNCTIONS = frozenset({"sigmoid", "sqrt", "erf", "relu"})
_K = math.sqrt(2.0 / math.pi)
_SQRT2 = math.sqrt(2.0)


def expand(domain, op: str, x: Any) -> Any | None:
    """``op(x)`` rebuilt from base functions in ``domain``; None when ``op`` has no rewrite."""
    if op not in REWRITTEN:
        return None

    def c(v: float):
        return domain.const(v, "float32")

    def mul(a, b):
        return domain.binary("mul", a, b)

    if op == "silu":
        return mul(x, domain.unary("sigmoid", x))
    if op == "rsqrt":
        return domain.binary("div", c(1.0), domain.unary("sqrt", x))
    if op == "tanh":
        return domain.binary("sub", mul(c(2.0), domain.unary("sigmoid", mul(c(2.0), x))), c(1.0))
    if op == "gelu_tanh":
        cube = mul(mul(x, x), x)
        u = mul(c(_K), domain.binary("add", x, mul(c(0.044715), cube)))
        return mul(x, domain.unary("sigmoid", mul(c(2.0), u)))
    # gelu, the erf form
    erf = domain.unary("erf", domain.binary("div", x, c(_SQRT2)))
    return mul(mul(c(0.5), x), domain.binary("add", c(1.0), erf))


REWRITTEN = frozenset({"silu", "rsqrt", "tanh", "gelu_tanh", "gelu"})
