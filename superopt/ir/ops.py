"""The op table: every operator of the μGraph IR, its arity, its category and its Lax status.

One table serves the Lax builder, the shape inference, the checker, the interpreter and the
verifier, so adding an op is one row here plus its meaning in each Domain.

Lax status (Mirage paper §4.2): *multilinear* ops (add, sub, mul, matmul, reductions by sum…),
*division*, and *exp* (never nested) form the fragment whose equivalence the finite-field test
decides with a provable error bound. *Opaque* ops (silu, rsqrt, max…) are outside it; the
verifier treats them as uninterpreted functions. *Structural* ops move data without arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Category(str, Enum):
    UNARY = "unary"          # elementwise, one operand
    BINARY = "binary"        # elementwise, two operands, numpy broadcasting
    REDUCE = "reduce"        # over one dim, attrs: dim, keepdim
    MATMUL = "matmul"        # batched over the last two dims, batch dims broadcast
    STRUCTURAL = "structural"  # reshape, transpose, concat, slice, cast
    CONST = "const"          # a scalar constant, attrs: value
    CUSTOMIZED = "customized"  # a kernel op that holds a block graph
    ACCUM = "accum"          # a block-level for-loop accumulator


class Lax(str, Enum):
    MULTILINEAR = "multilinear"
    DIVISION = "division"
    EXP = "exp"
    OPAQUE = "opaque"
    STRUCTURAL = "structural"


@dataclass(frozen=True)
class OpInfo:
    name: str
    category: Category
    lax: Lax
    arity: int  # -1: variadic (concat, customized)
    kernel_level: bool = True  # may appear in a kernel graph
    block_level: bool = True   # may appear in a block graph


def _table(*rows: OpInfo) -> dict[str, OpInfo]:
    return {row.name: row for row in rows}


C, L = Category, Lax
OPS: dict[str, OpInfo] = _table(
    OpInfo("const", C.CONST, L.STRUCTURAL, 0),
    OpInfo("add", C.BINARY, L.MULTILINEAR, 2),
    OpInfo("sub", C.BINARY, L.MULTILINEAR, 2),
    OpInfo("mul", C.BINARY, L.MULTILINEAR, 2),
    OpInfo("div", C.BINARY, L.DIVISION, 2),
    OpInfo("exp", C.UNARY, L.EXP, 1),
    OpInfo("square", C.UNARY, L.MULTILINEAR, 1),
    OpInfo("neg", C.UNARY, L.MULTILINEAR, 1),
    OpInfo("sqrt", C.UNARY, L.OPAQUE, 1),
    OpInfo("rsqrt", C.UNARY, L.OPAQUE, 1),
    OpInfo("silu", C.UNARY, L.OPAQUE, 1),
    OpInfo("gelu_tanh", C.UNARY, L.OPAQUE, 1),
    OpInfo("sigmoid", C.UNARY, L.OPAQUE, 1),
    OpInfo("tanh", C.UNARY, L.OPAQUE, 1),
    OpInfo("reduce_sum", C.REDUCE, L.MULTILINEAR, 1),
    OpInfo("reduce_max", C.REDUCE, L.OPAQUE, 1),
    OpInfo("matmul", C.MATMUL, L.MULTILINEAR, 2),
    OpInfo("transpose", C.STRUCTURAL, L.STRUCTURAL, 1),
    OpInfo("reshape", C.STRUCTURAL, L.STRUCTURAL, 1, block_level=False),
    OpInfo("concat", C.STRUCTURAL, L.STRUCTURAL, -1),
    OpInfo("slice", C.STRUCTURAL, L.STRUCTURAL, 1),
    OpInfo("cast", C.STRUCTURAL, L.STRUCTURAL, 1),
    OpInfo("customized", C.CUSTOMIZED, L.STRUCTURAL, -1, block_level=False),
    # Block-level for-loop accumulators (Mirage paper §3).
    OpInfo("accum_sum", C.ACCUM, L.MULTILINEAR, 1, kernel_level=False),
    OpInfo("accum_sum_sq", C.ACCUM, L.MULTILINEAR, 1, kernel_level=False),
    OpInfo("accum_max", C.ACCUM, L.OPAQUE, 1, kernel_level=False),
    # acc_i = acc_{i-1} * exp(m_{i-1} - m_i) + x_i, args (x, m) with m an accum_max: the
    # online-softmax rescale (flash attention). The final value is Σ_i exp(m_i - m_n) x_i.
    OpInfo("accum_sum_rescaled", C.ACCUM, L.MULTILINEAR, 2, kernel_level=False),
    # ---- data movement (ir/movement.py: shape rules; interp/movement.py: meaning) ----
    OpInfo("permute", C.STRUCTURAL, L.STRUCTURAL, 1),
    OpInfo("repeat", C.STRUCTURAL, L.STRUCTURAL, 1),
    OpInfo("gather", C.STRUCTURAL, L.STRUCTURAL, 2, block_level=False),
    OpInfo("scatter", C.STRUCTURAL, L.STRUCTURAL, 3, block_level=False),
    # ---- end data movement ----
    # ---- activations of Hugging Face decoders (issue 27, search-ops). Their identities with the
    # ops above (gelu = x/2·(1 + erf(x/√2)), relu² = square(relu)…) are modelled for verification
    # in ``interp.canonical``.
    OpInfo("gelu", C.UNARY, L.OPAQUE, 1),   # the erf form: x/2 · (1 + erf(x/√2))
    OpInfo("erf", C.UNARY, L.OPAQUE, 1),
    OpInfo("relu", C.UNARY, L.OPAQUE, 1),
    # ---- end of the activations block
)
del C, L

UNARY_OPS = frozenset(n for n, o in OPS.items() if o.category is Category.UNARY)
BINARY_OPS = frozenset(n for n, o in OPS.items() if o.category is Category.BINARY)
REDUCE_OPS = frozenset(n for n, o in OPS.items() if o.category is Category.REDUCE)
ACCUM_OPS = frozenset(n for n, o in OPS.items() if o.category is Category.ACCUM)
OPAQUE_OPS = frozenset(n for n, o in OPS.items() if o.lax is Lax.OPAQUE)
ELEMENTWISE_OPS = UNARY_OPS | BINARY_OPS | {"cast", "const"}

# dtypes are strings, never enum integers (Mirage's caches broke when enums were renumbered).
DTYPE_BYTES: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
DTYPES = tuple(DTYPE_BYTES)  # value dtypes
DTYPE_BYTES["int64"] = 8     # index tensors (gather / scatter positions, ir/movement.py)


def op_info(name: str) -> OpInfo:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") from None
