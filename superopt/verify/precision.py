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

Constants are checked per value (``constant_violations``), by the block search's own rule
(``PrecisionFloor``, which lives here so that the search and a cache's first use apply one rule): a
constant may be narrowed (cast, or declared narrow) only to a dtype the program holds it in. The
shipped Gemma-2 μGraphs cast eps and 1/2304 to bfloat16 where the program keeps both in float32,
and mean(x²) came out 0.2% high in every layer (issue 32).
"""
from __future__ import annotations

from ..ir import KernelGraph
from ..ir.ops import DTYPE_BYTES, OPAQUE_OPS
from .constants import constant_values

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
    """One line per op kind the candidate computes narrower than the program ever does, and per
    constant it narrows to a dtype the program never holds it in."""
    want, got = _narrowest(program), _narrowest(candidate)
    names = {v: k for k, v in DTYPE_BYTES.items()}
    return [f"{k} in {names[got[k]]}, the program never narrower than {names[w]}"
            for k, w in sorted(want.items()) if k in got and got[k] < w] + constant_violations(program, candidate)


class PrecisionFloor:
    """What the program says about dtypes, as two rules on the keys of its values (``env``: value
    name -> key: the search's normal forms, or ``program_floor``'s constant values):

    1. an arithmetic op (anything but ``cast`` / ``const``) whose result has the key of a value the
       program computes arithmetically may not produce it in a dtype narrower than the widest one
       the program computes it in (``x²`` in float32 in the program: a bfloat16 ``x²`` is too narrow);
    2. a narrowing cast is allowed only onto a (key, dtype) the program itself holds — its own cast
       back (``y.to(bf16)`` after the fp32 norm), an input, an output — never onto a partial sum, a
       constant or another value the program keeps wide."""

    def __init__(self, program: KernelGraph, env: dict):
        self.widest: dict = {}                     # key -> widest arithmetic dtype (bytes)
        self.held: set[tuple] = set()              # (key, dtype) of every program value
        for v in program.inputs:
            self.held.add((env[v.name], v.type.dtype))
        for n in program.nodes:
            e, dt = env[n.out.name], n.out.type.dtype
            self.held.add((e, dt))
            if n.op not in ("cast", "const"):
                self.widest[e] = max(self.widest.get(e, 0), DTYPE_BYTES[dt])

    def too_narrow(self, op: str, expr, dtype: str, arg_dtypes: list[str]) -> bool:
        if op == "cast":
            narrowing = DTYPE_BYTES[dtype] < DTYPE_BYTES[arg_dtypes[0]]
            return narrowing and (expr, dtype) not in self.held
        if op == "const":
            return False
        return DTYPE_BYTES[dtype] < self.widest.get(expr, 0)

    def const_dtype(self, expr, dtype: str) -> str:
        """The dtype a constant declared ``dtype`` is held at: ``dtype`` where the program holds it
        so (or never holds it), else the widest the program holds it in — a narrow declaration is a
        wide constant cast down (rule 2; the search only declares constants as the program does)."""
        dts = [d for e, d in self.held if e == expr]
        if not dts or dtype in dts:
            return dtype
        wide = max(dts, key=DTYPE_BYTES.__getitem__)
        return wide if self.too_narrow("cast", expr, dtype, [wide]) else dtype


def program_floor(program: KernelGraph) -> PrecisionFloor:
    """``PrecisionFloor`` of a program keyed by constant value: its constants are comparable with a
    candidate's (a μGraph has no normal forms to compare by), every other value is its own key."""
    consts = constant_values(program.nodes)
    env = {v.name: ("value", v.name) for v in program.inputs}
    env.update({n.out.name: ("const", consts[n.out.name]) if n.out.name in consts else ("value", n.out.name)
                for n in program.nodes})
    return PrecisionFloor(program, env)


def constant_violations(program: KernelGraph, candidate: KernelGraph) -> list[str]:
    """One line per constant the candidate narrows (casts down, or declares narrow) to a dtype the
    program never holds it in: rule 2 of ``PrecisionFloor``, on each block graph and the kernel level."""
    floor = program_floor(program)
    out: list[str] = []
    scopes = [(candidate.name, candidate.inputs, candidate.nodes)]
    scopes += [(n.outs[0].name, [i.value for i in n.block.inputs], n.block.nodes)
               for n in candidate.nodes if n.block is not None]
    for where, inputs, nodes in scopes:
        consts = constant_values(nodes)
        dtype = {v.name: v.type.dtype for v in inputs} | {o.name: o.type.dtype for n in nodes for o in n.outs}
        for n in nodes:
            if n.op not in ("cast", "const") or n.out.name not in consts:
                continue
            v, dt = n.out.name, n.out.type.dtype
            key = ("const", consts[v])
            if (floor.too_narrow("cast", key, dt, [dtype[n.args[0]]]) if n.op == "cast"
                    else floor.const_dtype(key, dt) != dt):
                out.append(f"constant {consts[v]:g} in {dt} (%{v} of {where}), the program never holds it so")
    return out
