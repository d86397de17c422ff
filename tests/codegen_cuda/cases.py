"""The μGraphs the CUDA codegen tests render: every fixture at its default shape, plus odd shapes
that take the other code paths (16-byte GEMV rows, several column groups per thread, batch 3/5)."""
from __future__ import annotations

from tests.fixtures.ugraphs import FIXTURES

# name -> (fixture builder name, shape kwargs)
ODD_SHAPES = {
    "rmsnorm_matmul_b3_k896_n256": ("rmsnorm_matmul", dict(rows=3, hidden=896, out=256)),
    "llama_qkv_k256_n72": ("llama_qkv", dict(rows=1, hidden=256, out=72)),
    "matmul_residual_b5_k160_n96": ("matmul_residual", dict(rows=5, hidden=160, out=96)),
    "gated_mlp_b3_k128_n64": ("gated_mlp", dict(rows=3, hidden=128, inter=64)),
    "decode_attention_b3_h6_kv2_d64": ("decode_attention", dict(batch=3, q_heads=6, kv_heads=2, head_dim=64,
                                                                kv_len=96)),
}


def all_cases() -> dict[str, tuple[str, dict]]:
    cases = {name: (name, {}) for name in FIXTURES}
    cases.update(ODD_SHAPES)
    return cases


def build(case: str, dtype: str):
    builder, kwargs = all_cases()[case]
    return FIXTURES[builder](dtype=dtype, **kwargs)
