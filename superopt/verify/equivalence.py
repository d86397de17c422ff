"""Probabilistic equivalence of two μGraphs: random trials over Z_p / Z_q plus a float64 check.

``check_equivalent(program, candidate)`` runs ``trials`` independent trials. Each draws fresh
uniform inputs (x.p ∈ Z_p, x.q ∈ Z_q, independent) and fresh keys for every uninterpreted
function, evaluates both graphs with ``FieldDomain`` through ``interp.evaluate`` (the same
interpreter as everywhere else) and compares every output residue mod p. A difference is a
counterexample. Then both graphs run once in float64 on random reals (``NumpyDomain``); a relative
Frobenius error above ``FLOAT_TOL`` rejects too (it catches what the field model cannot see,
e.g. a wrong constant that is exact in Z_p only by accident of the model).

The formal model (what "equivalent" means here). Terms are built from the inputs with + − × ÷,
rational constants, exp (never nested), opaque unary functions and max. Known identities between
opaque functions are applied first (``interp/canonical.py``): silu, rsqrt, tanh, gelu_tanh and
gelu are rewritten as terms over the base functions f ∈ {sigmoid, sqrt, erf, relu} — silu(x) =
x·sigmoid(x), rsqrt(x) = 1/sqrt(x), tanh(x) = 2·sigmoid(2x) − 1 (so a softcap c·tanh(x/c) too),
gelu_tanh(x) = x·sigmoid(2k(x + 0.044715x³)), gelu(x) = x/2·(1 + erf(x/fl(√2))). Every rewrite is
an identity of real functions, so everything below holds for the rewritten terms; the degree
analysis counts their atoms, products and divisions (rsqrt adds one division by a sqrt atom).
Their values live in the field of rational functions over Q in *atoms*:
the input variables; f(t), one atom per op and formally distinct argument t; M(S), one atom per
formally distinct multiset S of terms (max: associative and commutative, see field_domain.py);
and e^t, with e^a·e^b = e^(a+b). Formal equality implies equality over the reals (substitute the
real functions for the atoms), so the test never passes a candidate that formal algebra cannot
justify; it can reject a real identity the model does not know (max(a, a) = a, relu = max(x, 0),
a constant spelled as another float): a false alarm, never a false pass. A constant narrowed to 16
bits holds the rational its dtype holds, not the float it is written as: ``constants.held_constants``
folds each narrowing cast of a constant into the rounded value and takes a const declared in a
16-bit dtype at its 16-bit value, so a μGraph that casts eps or 1/n to bfloat16 where the program
keeps them in float32 differs from the program (issue 32). float32 and float64 consts stay the
rationals they spell, and casts of anything but constants stay identities: the rounding of data is
the dtype check's business (``precision``).

Theorem (one trial). Let output o differ formally between P and C. ``degree.py`` bounds, for
every element of o in each graph: numerator/denominator degrees n, d (atoms have degree 1);
U, the opaque arguments in the element's cone (UF arguments and max-multiset elements) and D_u
their largest degree n + d; V, the divisions and D_v the largest divisor numerator degree;
E, the exp applications and D_e the largest exponent degree. With D = n_P + d_P + n_C + d_C,

    Pr[the trial passes]  ≤  ε = D/p + C(U,2)·2D_u/p + V·D_v·(1/p + 1/q) + C(E,2)·2D_e/q + U·2^-32.

Proof. Bad events: (a) two formally distinct opaque arguments have equal residues mod p — their
difference has a nonzero numerator of degree ≤ 2D_u, so Schwartz–Zippel gives 2D_u/p a pair,
union over C(U,2) pairs; (b) a divisor vanishes mod p or mod q (then FieldDomain's 0⁻¹ = 0 breaks
the homomorphism): D_v/p + D_v/q each, union over V; (c) two formally distinct exponents coincide
mod q: 2D_e/q a pair; (d) the keyed hash reduced mod p is not exactly uniform: statistical
distance ≤ 2^64 mod p / 2^64 < 2^-32 per atom. Outside them every UF and max atom is a fresh
uniform residue (keyed splitmix64 as a random oracle; two different multisets of distinct residues
share a 64-bit signature sum with probability below 2^-56 for the sizes we see, inside (d)),
every division is exact, and P_o − C_o evaluates to N/Den with Den ≠ 0 and deg N ≤ D, N ≠ 0;
Schwartz–Zippel gives Pr[N = 0] ≤ D/p. Sum the terms. ∎

What is proved and what is assumed. For graphs without exp the statement is a theorem in the
random-oracle model of the hash. With exp, step "N ≠ 0 at a random point w.p. ≥ 1 − D/p" treats
the values g^(t mod q) of distinct exponents as independent atoms; that is an assumption (Mirage
makes it; Li & Wu, "Identity Testing for Circuits with Exponentiation Gates", 2025, prove weaker
soundness and state the strong form as a number-theoretic conjecture), and (c) only counts
pairwise merges of exp arguments, not of their sums. The counts are per output *element* with
multiplicity, so ε is small at the small shapes the search verifies at and can reach 1 (no
guarantee) at full model shapes with long reductions; ``Verdict`` prints whatever it is.

Trials use independent inputs and keys, so all k trials pass with probability ≤ ε^k: the
``error_bound`` of the Verdict. Measured with the default field (p ≈ 2^31): the dense fixtures
(RMSNorm → matmul, MLP, LoRA, nTrans) have ε ≈ 1e-8 (8 trials: ≈ 1e-60), also at the Llama-3-8B
qkv shape; attention with online softmax, whose cones hold hundreds of exp and max atoms, has
ε ≈ 1e-3 at the fixtures' small shapes (8 trials: ≈ 1e-20) — the pairwise exp and opaque-argument
terms dominate, and grow with the square of the sequence length; ask for more trials there.

Positions (``int64`` inputs of ``gather`` / ``scatter``, ``ir.movement``) are not field elements:
each trial draws them uniformly among the valid ones (distinct for a scatter; ``interp.movement``)
and both graphs read the same. For fixed positions both graphs are the terms above (data movement
is a fixed linear map), so the theorem holds conditionally on the positions; a candidate wrong only
at some positions is caught with the probability that a trial draws one of them — a KV-cache write
at the wrong row is caught unless the drawn row maps to itself. Views and slices are such maps too.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..interp import NumpyDomain, evaluate
from ..interp.field_domain import FieldDomain
from ..interp.movement import random_indices
from ..ir import KernelGraph
from .constants import held_constants
from .degree import trial_bound
from .fields import Field, default_field

FLOAT_TOL = 1e-9  # relative Frobenius error of the float64 check


@dataclass(frozen=True)
class Verdict:
    equivalent: bool
    trials_run: int
    error_bound: float        # Pr[a non-equivalent candidate passes every trial run]
    per_trial_bound: float    # ε of the module docstring
    reason: str
    counterexample: tuple[int, int, tuple[int, ...]] | None  # (trial, output index, position)
    float_rel_error: float | None
    seconds: float
    field: Field | None = None

    def __str__(self) -> str:
        where = f"over Z_p (p={self.field.p}, q={self.field.q})" if self.field else "over Z_p"
        flt = "not run" if self.float_rel_error is None else f"{self.float_rel_error:.1g}"
        trials = f"{self.trials_run} trial{'s' if self.trials_run != 1 else ''}"
        if self.equivalent:
            return (f"equivalent: {trials} {where}, error bound {self.error_bound:.1g}, "
                    f"float64 rel err {flt}, {self.seconds:.2f} s")
        return f"not equivalent: {self.reason} ({trials} {where}, float64 rel err {flt}, {self.seconds:.2f} s)"


def _signature(g: KernelGraph) -> dict[str, tuple]:
    return {v.name: (v.type.shape, v.type.dtype) for v in g.inputs}


def _uses_exp(g: KernelGraph) -> bool:
    nodes = list(g.nodes)
    for n in g.nodes:
        if n.block is not None:
            nodes += n.block.nodes
    return any(n.op in ("exp", "accum_sum_rescaled") for n in nodes)


def check_inputs(program: KernelGraph, candidate: KernelGraph) -> None:
    """Raise ``ValueError`` unless both graphs take the same inputs (names, shapes, dtypes)."""
    a, b = _signature(program), _signature(candidate)
    if a != b:
        diff = [f"%{k}: {a.get(k, 'missing')} vs {b.get(k, 'missing')}"
                for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        raise ValueError(f"check_equivalent: {program.name!r} and {candidate.name!r} take different inputs "
                         f"(program vs candidate): {'; '.join(diff)}")


def _first_difference(x: np.ndarray, y: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(x != y)[0])


def float_rel_error(program: KernelGraph, candidate: KernelGraph, seed: int) -> float:
    """max over outputs of ‖C − P‖/‖P‖ on random inputs of mean 0 and variance 1 (``NumpyDomain.random_input``), both graphs in float64."""
    program, candidate = held_constants(program), held_constants(candidate)
    dom = NumpyDomain()
    rng = np.random.default_rng([seed, 1 << 31])
    inputs = {v.name: dom.random_input(rng, v.type.shape, v.type.dtype) for v in program.inputs
              if v.type.dtype != "int64"}
    inputs.update(random_indices(program, rng, dom))  # positions: valid, distinct for a scatter
    worst = 0.0
    for p_out, c_out in zip(evaluate(program, inputs, dom), evaluate(candidate, inputs, dom)):
        p_out, c_out = np.asarray(p_out, dtype=np.float64), np.asarray(c_out, dtype=np.float64)
        ref = float(np.linalg.norm(p_out))
        err = float(np.linalg.norm(c_out - p_out)) / (ref if ref > 0 else 1.0)
        worst = max(worst, err if np.isfinite(err) else float("inf"))
    return worst


def field_trial(program: KernelGraph, candidate: KernelGraph, field: Field, seed: int,
                trial: int) -> tuple[int, tuple[int, ...]] | None:
    """One trial: fresh inputs and keys from (seed, trial); the first differing (output, position)."""
    program, candidate = held_constants(program), held_constants(candidate)
    track_q = _uses_exp(program) or _uses_exp(candidate)
    dom = FieldDomain(field.p, field.q, field.g, seed=(seed << 32) + trial, track_q=track_q)
    rng = np.random.default_rng([seed, trial])
    inputs = {v.name: dom.random_input(rng, v.type.shape, v.type.dtype) for v in program.inputs
              if v.type.dtype != "int64"}
    inputs.update(random_indices(program, rng, dom))  # positions: valid, distinct for a scatter
    for i, (a, b, t) in enumerate(zip(evaluate(program, inputs, dom), evaluate(candidate, inputs, dom),
                                      program.output_types)):
        a_p, b_p = np.broadcast_to(a.p, t.shape), np.broadcast_to(b.p, t.shape)
        if not np.array_equal(a_p, b_p):
            return i, _first_difference(a_p, b_p)
    return None


def check_equivalent(program: KernelGraph, candidate: KernelGraph, trials: int = 8, seed: int = 0,
                     float_check: bool = True, field: Field | None = None) -> Verdict:
    """Decide whether ``candidate`` computes ``program`` (see the module docstring for the bound)."""
    t0 = time.perf_counter()
    check_inputs(program, candidate)
    field = field or default_field()
    eps = trial_bound(program, candidate, field.p, field.q)

    def verdict(ok: bool, run: int, reason: str, cex: Any = None, rel: float | None = None) -> Verdict:
        return Verdict(ok, run, eps**run if run else 1.0, eps, reason, cex, rel,
                       time.perf_counter() - t0, field)

    p_types, c_types = program.output_types, candidate.output_types
    if len(p_types) != len(c_types):
        return verdict(False, 0, f"{len(p_types)} outputs vs {len(c_types)}")
    for i, (a, b) in enumerate(zip(p_types, c_types)):
        if a.shape != b.shape:
            return verdict(False, 0, f"output {i} has shape {list(b.shape)}, expected {list(a.shape)}")
    for t in range(trials):
        diff = field_trial(program, candidate, field, seed, t)
        if diff is not None:
            i, pos = diff
            return verdict(False, t + 1, f"output {i} differs at index {pos} in trial {t}", (t, i, pos))
    rel = None
    if float_check:
        rel = float_rel_error(program, candidate, seed)
        if not rel <= FLOAT_TOL:
            return verdict(False, trials, f"float64 check: relative error {rel:.3g} > {FLOAT_TOL:g}", None, rel)
    return verdict(True, trials, "all trials agree", None, rel)
