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
"""
from __future__ import annotations

from ..verify.precision import PrecisionFloor

__all__ = ["PrecisionFloor"]
