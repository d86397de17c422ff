"""Norms and activations of Hugging Face decoders as Lax composites (the math of their modules).

``layer_norm`` covers ``nn.LayerNorm`` with and without weight and bias and the LayerNorm1p /
(1 + w) forms (``offset=1``); Gemma's RMSNorm is ``Program.rms_norm(x, p.add(w, 1.0))``.
``activation(p, name, x)`` maps a ``transformers.activations.ACT2FN`` name to Lax ops; ``ACT_NAMES``
lists the names covered, ``ACT_NOT_COVERED`` the ones that are not (and why).
"""
from __future__ import annotations

import math

# ACT2FN names whose function is already one op or a short composition of ops.
ACT_NAMES = ("silu", "swish", "gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh",
             "gelu_accurate", "gelu_fast", "quick_gelu", "relu", "relu2", "tanh", "sigmoid", "linear")
ACT_NOT_COVERED = {
    "gelu_10": "clips at ±10: needs clamp (min/max with a constant)",
    "relu6": "needs clamp (min/max with a constant)",
    "leaky_relu": "needs a select / max(x, a·x)",
    "mish": "needs softplus = log(1 + exp(x)) (log is not an op)",
    "laplace": "needs erf of an affine argument with learned constants; no decoder uses it",
    "prelu": "a learned slope: a module, not a function",
    "xielu": "learned piecewise function with a select; not an op",
    "hardswish": "x·relu6(x + 3)/6: needs clamp",
    "sqrtsoftplus": "needs softplus = log(1 + exp(x)) (log is not an op)",
}


def layer_norm(p, x, weight=None, bias=None, eps: float = 1e-5, dim: int = -1, offset: float = 0.0):
    """(x − mean(x)) · rsqrt(mean((x − mean(x))²) + eps) [· (weight + offset)] [+ bias]."""
    centred = p.sub(x, p.mean(x, dim, keepdim=True))
    var = p.mean(p.square(centred), dim, keepdim=True)
    y = p.mul(centred, p.rsqrt(p.add(var, p.const(eps, x.dtype))))
    if weight is not None:
        y = p.mul(y, weight if not offset else p.add(weight, p.const(offset, weight.dtype)))
    return y if bias is None else p.add(y, bias)


def gelu_fast(p, x):
    """HF's FastGELUActivation: 0.5·x·(1 + tanh(0.7978845608·x·(1 + 0.044715·x²)))."""
    c = lambda v: p.const(v, x.dtype)  # noqa: E731
    inner = p.mul(p.mul(x, c(0.7978845608)), p.add(c(1.0), p.mul(c(0.044715), p.square(x))))
    return p.mul(p.mul(c(0.5), x), p.add(c(1.0), p.tanh(inner)))


def gelu_tanh_written(p, x):
    """HF's NewGELUActivation written out: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    c = lambda v: p.const(v, x.dtype)  # noqa: E731
    cube = p.mul(p.mul(x, x), x)
    inner = p.mul(c(math.sqrt(2.0 / math.pi)), p.add(x, p.mul(c(0.044715), cube)))
    return p.mul(p.mul(c(0.5), x), p.add(c(1.0), p.tanh(inner)))


def softcap(p, x, cap: float):
    """Gemma-2's logit soft-capping: cap · tanh(x / cap)."""
    return p.mul(p.tanh(p.div(x, p.const(cap, x.dtype))), p.const(cap, x.dtype))


def activation(p, name: str, x):
    """``ACT2FN[name](x)`` as Lax ops; ``ValueError`` naming the gap for the others."""
    if name in ("silu", "swish"):
        return p.silu(x)
    if name in ("gelu", "gelu_python"):
        return p.gelu(x)
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate"):
        return p.gelu_tanh(x)
    if name == "gelu_fast":
        return gelu_fast(p, x)
    if name == "quick_gelu":
        return p.mul(x, p.sigmoid(p.mul(x, p.const(1.702, x.dtype))))
    if name == "relu":
        return p.relu(x)
    if name == "relu2":
        return p.square(p.relu(x))
    if name in ("tanh", "sigmoid"):
        return getattr(p, name)(x)
    if name == "linear":
        return x
    why = ACT_NOT_COVERED.get(name, "not an ACT2FN name this module knows")
    raise ValueError(f"activation {name!r} has no Lax mapping: {why}; covered: {', '.join(ACT_NAMES)}")
