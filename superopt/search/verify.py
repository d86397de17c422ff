"""Verification of search candidates: at a reduced shape by the equivalence checker, at the real
shape by a float64 comparison when the inputs are small enough to evaluate twice."""
from __future__ import annotations

from ..abstract import ProgramIndex
from ..ir import KernelGraph, check
from ..verify import FLOAT_TOL, check_equivalent, float_rel_error
from .instantiate import build, reduced_extents, reduced_sizes, reshape_program
from .skeleton import Design


def verify_reduced(program: KernelGraph, index: ProgramIndex, design: Design, seed: int,
                   arch: str, finish=None) -> tuple[bool, str]:
    """Re-build the design at small odd-tiled sizes (2 blocks and 2 iterations per tiled index) and
    run ``check_equivalent`` (8 finite-field trials and a float64 check) against the program there.
    ``finish``: the pass the built candidate goes through first (``softmax.stabilize``)."""
    sizes = reduced_sizes(design, index)
    small = reshape_program(program, index, sizes)
    try:
        cand = build(design, small, index, tuple(reduced_extents(k, _resized(index, sizes)) for k in design))
        cand = check(finish(cand) if finish is not None else cand, arch)
    except ValueError as e:
        return False, f"reduced instance invalid: {e}"
    v = check_equivalent(small, cand, trials=8, seed=seed)
    shape = "x".join(str(sizes[i]) for i in sorted(sizes))
    return v.equivalent, f"reduced sizes {shape}: {v}"


def _resized(index: ProgramIndex, sizes: dict) -> ProgramIndex:
    return ProgramIndex(index.labels, sizes, index.consts, index.ops)


def verify_full(program: KernelGraph, candidate: KernelGraph, seed: int, max_elements: int) -> tuple[bool, str]:
    n = sum(v.type.numel for v in program.inputs)
    if n > max_elements:
        return True, f"real shape not re-verified ({n} input elements > {max_elements})"
    err = float_rel_error(program, candidate, seed)
    return err <= FLOAT_TOL, f"real shape float64 rel err {err:.2g}"
