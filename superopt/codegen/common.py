"""Naming and layout rules the Triton renderer shares across its modules: identifiers, row-major strides.

``identifier`` is the one rule for every place a name lands in generated text (Triton kernels and
their variables): every character outside
``[A-Za-z0-9_]`` becomes ``_``, and a name that would start with a digit (or be empty) gets a
``g_`` prefix.
"""
from __future__ import annotations

import re

_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]")


def identifier(name: str) -> str:
    """``name`` as an identifier valid in Python, C and torch.library op names."""
    s = _NOT_IDENT.sub("_", name)
    return s if s and not s[0].isdigit() else f"g_{s}"


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major (contiguous) strides of ``shape``, in elements."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]
