"""The float64 numpy Domain: the numeric reference every other result is compared against."""
from __future__ import annotations

import math

import numpy as np


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_erf_scalar = np.vectorize(math.erf, otypes=[np.float64])


def _erf(x):
    # math.erf is correctly rounded to ~1 ulp in float64; numpy has no erf of its own.
    return _erf_scalar(np.asarray(x, dtype=np.float64))


_UNARY = {
    "exp": np.exp,
    "neg": np.negative,
    "square": np.square,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "gelu_tanh": _gelu_tanh,
    # ---- activations (issue 27, search-ops)
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "erf": lambda x: _erf(x),
    "relu": lambda x: np.maximum(x, 0.0),
    # ---- end of the activations block
}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum}


_SQRT3 = 3 ** 0.5


class NumpyDomain:
    """Everything in float64, whatever the declared dtype: casts are exact no-ops."""

    name = "float64"

    def const(self, value, dtype):
        return np.float64(value)

    def unary(self, op, x):
        return _UNARY[op](x)

    def binary(self, op, a, b):
        return _BINARY[op](a, b)

    def reduce(self, op, x, axis, keepdim):
        f = np.sum if op == "reduce_sum" else np.max
        return f(x, axis=axis, keepdims=keepdim)

    def matmul(self, a, b):
        return np.matmul(a, b)

    def cast(self, x, dtype):
        return x

    def shape(self, x):
        return np.shape(x)

    def reshape(self, x, shape):
        return np.reshape(x, tuple(shape))

    def permute(self, x, axes):
        return np.transpose(x, tuple(axes))

    def concat(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def slice(self, x, axis, start, stop):
        idx = [slice(None)] * np.ndim(x)
        idx[axis] = slice(start, stop)
        return np.asarray(x)[tuple(idx)]

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, tuple(shape))

    def random_input(self, rng: np.random.Generator, shape, dtype):
        """Uniform on [-√3, √3): mean 0 and variance 1, as a standard normal, drawn ~5x faster (the
        float64 check draws every weight of the program: 117M values for Llama-3.1-8B's MLP). Any
        continuous distribution serves the check: a nonzero difference of the two graphs' (analytic)
        functions vanishes only on a set of measure zero."""
        x = rng.random(shape)
        x *= 2 * _SQRT3
        x -= _SQRT3
        return x
