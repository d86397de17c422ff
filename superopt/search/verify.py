"""Verification of search candidates: at a reduced shape by the equivalence checker, at the real
shape by a float64 comparison when the inputs are small enough to evaluate twice."""
from __future__ import annotations

from dataclasses import replace

from ..abstract import ProgramIndex
from ..ir import KernelGraph, check, make_attrs
from ..verify import FLOAT_TOL, check_equivalent, float_rel_error
from ..verify.precision import precision_violations
from .instantiate import build, reduced_extents, reduced_sizes, reshape_program
from .skeleton import Design


def verify_reduced(program: KernelGraph, index: ProgramIndex, design: Design, seed: int,
                   arch: str, finish=None, precision: bool = True) -> tuple[bool, str]:
    """Re-build the design at small odd-tiled sizes (2 blocks and 2 iterations per tiled index) and
    run ``check_equivalent`` (8 finite-field trials and a float64 check) against the program there,
    after the dtype check ``verify.precision`` (unless ``precision`` is off: the ablation).
    ``finish``: the pass the built candidate goes through first (``softmax.stabilize``)."""
    sizes = reduced_sizes(design, index)
    small, index_small = _recounted(reshape_program(program, index, sizes), _resized(index, sizes),
                                    count_consts(program, index))
    try:
        cand = build(design, small, index_small, tuple(reduced_extents(k, index_small) for k in design))
        cand = check(finish(cand) if finish is not None else cand, arch)
    except ValueError as e:
        return False, f"reduced instance invalid: {e}"
    shape = "x".join(str(sizes[i]) for i in sorted(sizes))
    narrow = precision_violations(small, cand) if precision else []
    if narrow:
        return False, f"reduced sizes {shape}: precision: {'; '.join(narrow)}"
    v = check_equivalent(small, cand, trials=8, seed=seed)
    return v.equivalent, f"reduced sizes {shape}: {v}"


def _resized(index: ProgramIndex, sizes: dict) -> ProgramIndex:
    return replace(index, sizes=sizes)   # the movement maps and pinned ids stay


def count_consts(program: KernelGraph, index: ProgramIndex) -> dict[int, int]:
    """Constants that count a summed index — the n of ``Program.mean`` (Σ_i x / n with n the extent
    of i): position among the program's consts -> index id. The normal form uses Σ_i c = n·c, so a
    LayerNorm design may rely on n being that extent; at a reduced shape n must shrink with it."""
    pos, made_by = {}, {}
    for n in program.nodes:
        if n.op == "const":
            pos[n.out.name] = len(pos)
        made_by[n.out.name] = n
    out = {}
    for n in program.nodes:
        if n.op != "div" or n.args[1] not in pos or n.args[0] not in made_by:
            continue
        r = made_by[n.args[0]]
        if r.op != "reduce_sum":
            continue
        idx = index.labels[r.args[0]][r.attr("dim")]
        if idx >= 0 and float(index.consts[pos[n.args[1]]][0]) == index.sizes[idx]:
            out[pos[n.args[1]]] = idx
    return out


def _recounted(small: KernelGraph, index: ProgramIndex, counts: dict[int, int]):
    """``small`` and ``index`` with every counting constant set to its index's (reduced) extent."""
    # The block search reuses one constant for equal values (two norms' n), so a value is recounted
    # only when every constant of that value counts an index of one and the same reduced extent.
    by_value: dict[float, set] = {}
    for k, (v, _) in enumerate(index.consts):
        by_value.setdefault(float(v), set()).add(index.sizes[counts[k]] if k in counts else None)
    counts = {k: i for k, i in counts.items() if len(by_value[float(index.consts[k][0])]) == 1}
    if not counts:
        return small, index
    consts = tuple((float(index.sizes[counts[k]]), dt) if k in counts else (v, dt)
                   for k, (v, dt) in enumerate(index.consts))
    nodes, k = [], 0
    for n in small.nodes:
        if n.op == "const":
            if k in counts:
                n = replace(n, attrs=make_attrs(value=consts[k][0], dtype=consts[k][1]))
            k += 1
        nodes.append(n)
    return replace(small, nodes=tuple(nodes)), replace(index, consts=consts)


def verify_full(program: KernelGraph, candidate: KernelGraph, seed: int, max_elements: int) -> tuple[bool, str]:
    n = sum(v.type.numel for v in program.inputs)
    if n > max_elements:
        return True, f"real shape not re-verified ({n} input elements > {max_elements})"
    err = float_rel_error(program, candidate, seed)
    return err <= FLOAT_TOL, f"real shape float64 rel err {err:.2g}"
