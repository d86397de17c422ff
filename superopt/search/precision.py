"""Precision as a constraint of the block search: no arithmetic in a narrower dtype than the program's.

Casts change no value, so the abstract domain (and the finite-field verifier) cannot tell a sum of
squares accumulated in float32 — HF's ``x.float()`` inside RMSNorm, the fp32 softmax — from the same
sum in bfloat16. The block search would happily drop the upcast. ``PrecisionFloor`` keeps what the
program says about dtypes, as two rules on the normal forms of the program's values (the rules live
in ``verify.precision``: a cached μGraph is held to the same ones on first use): an arithmetic op
may not compute a value narrower than the program computes it (rule 1), and a narrowing cast goes
only onto a (normal form, dtype) the program itself holds (rule 2).

Operands of one op must share a dtype (``ir.shapes``), so a value derived from wide values stays
wide unless rule 2 allows a narrowing; partial sums and reorderings the program does not hold are
thereby computed at least as wide as their operands. Pruned values count as "precision".

A third rule is not about the program's values but about what a design adds: **partial results summed
across blocks are carried at the accumulation precision** (``accumulation_dtype``: float32 for
bf16 / fp16). A split kernel's blocks each hold one part of a sum the program computes whole; a
bf16 tensor of those parts rounds the total before the combine divides by it (and a backend that
added the parts in bf16 would round every add, growing with the splits; Triton's workspaces and
torch's sums add in float32, ``benchmarks/results/split_partials_cpu_2026-11-26.md``).
``widen_partials`` makes the split kernel store its parts in that dtype; the combine kernel is then
searched on the wide parts with the program's output dtypes to cast to (``kernel.run_pattern``), so
its arithmetic on the sums runs wide and the result is rounded once, as a hand-written
flash-decoding combine does.
"""
from __future__ import annotations

from ..ir.ops import DTYPE_BYTES
from ..verify.precision import PrecisionFloor
from .skeleton import KernelSkeleton

ACCUMULATION = "float32"  # the dtype sums of bf16 / fp16 values accumulate in (tensor cores, tl.dot, torch)


def accumulation_dtype(dtype: str) -> str:
    """The dtype a sum of ``dtype`` values is carried in: float32 for narrower floats, else itself."""
    return ACCUMULATION if DTYPE_BYTES[dtype] < DTYPE_BYTES[ACCUMULATION] else dtype


def widen_partials(k: KernelSkeleton, dtypes: list[str], final: list[bool]) -> tuple[KernelSkeleton, list[str]]:
    """Split kernel ``k`` (outputs summed across blocks, in ``dtypes``) with each narrower output
    cast to its accumulation dtype before it leaves the block, except those ``final`` (a program
    output as it stands: nothing computes on the total); returns it and the outputs' dtypes."""
    nodes, outputs, wide = list(k.nodes), [], []
    for (ref, omap, reduce, name), dt, last in zip(k.outputs, dtypes, final):
        acc = dt if last else accumulation_dtype(dt)
        if acc != dt:
            nodes.append(("cast", (ref,), (("dtype", acc),)))
            ref = len(k.inputs) + len(nodes) - 1
        outputs.append((ref, omap, reduce, name))
        wide.append(acc)
    return KernelSkeleton(k.pattern, k.sources, k.inputs, tuple(nodes), tuple(outputs), k.out_labels), wide


__all__ = ["ACCUMULATION", "PrecisionFloor", "accumulation_dtype", "widen_partials"]
