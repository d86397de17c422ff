"""A dtype check beside the value check: a candidate may not do in a narrower dtype what the program
does wide.

The finite-field test and the float64 check are blind to dtypes (casts are identities in both).
``precision_violations(program, candidate)`` compares, per arithmetic op kind that rounds (square,
sqrt, rsqrt, exp, the opaque activations, division, and the sums: ``reduce_sum``, ``matmul`` and the
for-loop accumulators, which are one kind), the narrowest dtype the candidate uses with the narrowest the
program uses. HF's RMSNorm squares and sums in float32 after ``x.float()``; a candidate squaring in
bfloat16 is reported. Kinds the program does not use are not constrained, and a kind the program
uses in several dtypes is constrained to the narrowest of them: the check is coarse (per kind, not per
value — the block search's ``search.precision`` rule is per value) and never rejects a candidate
whose every op of a kind is at least as wide as the program's narrowest one of that kind. Elementwise
add / mul are not checked: a weight multiply runs in the model's dtype by design.
"""
from __future__ import annotations

from ..ir import KernelGraph
from ..ir.ops import DTYPE_BYTES, OPAQUE_OPS

# A matmul sums too, and its for-loop accumulator is an accum_sum: one kind, or every K-looped
# projection in the model's dtype would look narrower than an fp32 norm's sum.
_SUMS = frozenset({"reduce_sum", "accum_sum", "accum_sum_sq", "accum_sum_rescaled", "matmul"})
CHECKED = frozenset({"square", "div", "exp"}) | (OPAQUE_OPS - {"reduce_max", "accum_max"}) | _SUMS


def _kind(op: str) -> str:
    return "sum" if op in _SUMS else op


def _narrowest(graph: KernelGraph) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in graph.nodes:
        for m in (n.block.nodes if n.block is not None else (n,)):
            if m.op in CHECKED:
                k = _kind(m.op)
                out[k] = min(out.get(k, 99), DTYPE_BYTES[m.out.type.dtype])
    return out


def precision_violations(program: KernelGraph, candidate: KernelGraph) -> list[str]:
    """One line per op kind the candidate computes narrower than the program ever does."""
    want, got = _narrowest(program), _narrowest(candidate)
    names = {v: k for k, v in DTYPE_BYTES.items()}
    return [f"{k} in {names[got[k]]}, the program never narrower than {names[w]}"
            for k, w in sorted(want.items()) if k in got and got[k] < w]
