"""The μGraph cases the Triton tests run: every fixture at its small default shape plus odd shapes."""
from __future__ import annotations

from tests.fixtures.ugraphs import FIXTURES

# (case id, fixture name, builder kwargs): odd sizes make tiles of 1, 3, 5, 7 and masks everywhere
ODD = [
    ("rmsnorm_matmul_odd", "rmsnorm_matmul", dict(rows=3, hidden=90, out=70)),
    ("matmul_residual_odd", "matmul_residual", dict(rows=5, hidden=73, out=42)),
    ("ntrans_odd", "ntrans", dict(rows=3, hidden=73)),
    ("decode_attention_odd", "decode_attention", dict(batch=3, q_heads=6, kv_heads=2, head_dim=16, kv_len=96)),
]
CASES = [(name, name, {}) for name in FIXTURES] + ODD
INTERP_DTYPES = ("float32", "float16")  # bf16 arithmetic is broken in the interpreter (DESIGN.md)


def build(case_id: str, dtype: str):
    for cid, name, kw in CASES:
        if cid == case_id:
            return FIXTURES[name](dtype=dtype, **kw)
    raise KeyError(case_id)
