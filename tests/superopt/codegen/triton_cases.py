"""The μGraph cases the Triton tests run: every fixture at its small default shape plus odd shapes."""
from __future__ import annotations

import dataclasses

from tests.fixtures.ugraphs import FIXTURES

# (case id, fixture name, builder kwargs): odd sizes make tiles of 1, 3, 5, 7 and masks everywhere
ODD = [
    ("rmsnorm_matmul_odd", "rmsnorm_matmul", dict(rows=3, hidden=90, out=70)),
    ("matmul_residual_odd", "matmul_residual", dict(rows=5, hidden=73, out=42)),
    ("ntrans_odd", "ntrans", dict(rows=3, hidden=73)),
    ("decode_attention_odd", "decode_attention", dict(batch=3, q_heads=6, kv_heads=2, head_dim=16, kv_len=96)),
    # split-K RMSNorm: K in parts over grid z, each block's rms from its whole rows, the parts summed
    ("rmsnorm_matmul_split_k", "rmsnorm_matmul", dict(rows=3, hidden=90, out=70, split_k=3)),
    ("llama_qkv_split_k", "llama_qkv", dict(rows=2, hidden=128, out=40, split_k=2)),
]
# x @ W^T with W stored [N, K] (an HF Linear), K in a for-loop: one output element a block (the
# decode GEMV the search picks for Qwen2.5-0.5B mlp_out at m=1, tests/superopt/codegen/ugraphs, small), or
# all N = 5 in one block ("cols"). The renderer reads W's tiles as loaded (no transpose) and sums
# the products after the loop.
GEMV_NK = """graph gemv_nk_fused
input %w : {dt}[5,{k}]
input %x : {dt}[1,{k}]
%y = customized(%w, %x) : {dt}[1,5] {{
  grid {g},1,1 threads 128 forloop 3
  in %i0 = arg0 imap({im},-1,-1) fmap 1 : {dt}[{n},{t}]
  in %i1 = arg1 imap(-1,-1,-1) fmap 1 : {dt}[1,{t}]
  %v0 = transpose(%i0) : {dt}[{t},{n}]
  %v1 = matmul(%i1, %v0) : {dt}[1,{n}]
  %v2 = accum_sum(%v1) : {dt}[1,{n}]
  out %v2 omap({om},-1,-1) reduce none
}}
output %y
"""
# 90: K tiles of 30, padded to 32
TEXT_CASES = {"gemv_nk": dict(k=96), "gemv_nk_odd": dict(k=90), "gemv_nk_cols": dict(k=90, cols=True)}

# μGraphs from files (tests/superopt/codegen/ugraphs), their own float64 evaluation the reference (case id ->
# file). qwen05b_attn_in_1_m1, found by the search on the GPU: RMSNorm + k/v GEMVs split over K (112
# blocks adding into three outputs, one tile count: the last block stores all three), then a
# one-block kernel. row_and_column_sums: a 2×3 grid summing one output over x and the other over y
# (two sets of counters, 2 + 3 tiles), with masked, padded tiles. split_k_then_residual: an 8-row
# GEMV split over K (grid 8×4, 16-column tiles summed over y), then a residual add whose blocks each
# take 64 columns (four of the GEMV's tiles) of half the rows: the shape of a decode down projection
# the search splits at m8.
# sum_of_squares_scaled_in_the_loop: an 8-row gated MLP (5 rows here) as session 42's search shipped it for
# Qwen2.5-0.5B, its norm's sum of squares divided by K inside the loop and then accumulated (rendered as a deferred
# sum divided once after the loop, ``triton_block.scaled_sums``), gate and up in 32-row tiles (one stacked dot).
FOUND_CASES = {"found_kv_split_k": "qwen05b_attn_in_1_m1", "two_way_sums": "row_and_column_sums",
               "split_k_then_residual": "split_k_then_residual",
               "scaled_sum_of_squares": "sum_of_squares_scaled_in_the_loop"}

# Fixtures re-tiled to blocks of 64+ output columns and fewer than 64 rows (case id -> fixture name,
# kwargs, grid, forloop): the renderer accumulates those dots transposed, (W·xᵀ)ᵀ (wgmma-eligible).
# Odd extents pad both the rows (5 -> 16) and the columns (65, 70 -> 128); [N, K] and [K, N] weights,
# split-K, a residual added after the loop, and K tiles padded (30 -> 32).
WIDE_CASES = {
    "llama_qkv_wide": ("llama_qkv", dict(rows=5, hidden=96, out=130), (1, 2, 1), 3),
    "rmsnorm_matmul_wide": ("rmsnorm_matmul", dict(rows=3, hidden=90, out=70), (1, 1, 1), 3),
    "llama_qkv_split_k_wide": ("llama_qkv", dict(rows=6, hidden=128, out=64, split_k=2), (1, 1, 2), 2),
    "matmul_residual_wide": ("matmul_residual", dict(rows=9, hidden=64, out=128), (1, 2, 1), 2),
    # gate and up tiles of 32 rows each, run as one 64-row swapped dot on the two stacked (``_stacked_pairs``)
    "rmsnorm_gated_mlp_stacked": ("rmsnorm_gated_mlp", dict(rows=5, hidden=96, inter=96), (1, 3, 1), 3),
}

# Cases whose split kernel can run its combine in its last blocks (ir.chain): the renderer's chained
# launch variant is run for these (and test_triton_render checks that no other case chains). The two
# split-K cases finish their cross-block sums before counting into the chain's groups;
# split_k_then_residual's consumer blocks each read four producer blocks' tiles (a ratio of 4).
CHAIN_CASES = ("gqa", "qknorm", "decode_attention", "decode_attention_odd", "found_kv_split_k",
               "split_k_then_residual")

# the cases whose kernels sum across blocks (``reduce sum``): also run with those sums ordered (``Launch.ordered``)
SUMMED_CASES = ("rmsnorm_matmul_split_k", "llama_qkv_split_k", "found_kv_split_k", "two_way_sums",
                "split_k_then_residual", "llama_qkv_split_k_wide")
CASES = [(name, name, {}) for name in FIXTURES] + ODD + [(c, c, {}) for c in TEXT_CASES] + \
    [(c, c, {}) for c in FOUND_CASES] + [(c, c, {}) for c in WIDE_CASES]
INTERP_DTYPES = ("float32", "float16")  # bf16 arithmetic is broken in the interpreter (docs/conventions.md)


def _gemv_nk(dtype: str, k: int, cols: bool = False):
    from superopt.ir import check, from_text
    from superopt.lax import Program
    from tests.fixtures.build import Fixture

    p = Program("gemv_nk")
    w, x = p.input("w", (5, k), dtype), p.input("x", (1, k), dtype)
    p.output(p.matmul(x, p.transpose(w)))
    tiling = dict(g=1, im=-1, n=5, om=-1) if cols else dict(g=5, im=0, n=1, om=1)
    ugraph = check(from_text(GEMV_NK.format(dt=dtype, k=k, t=k // 3, **tiling)))
    return Fixture("gemv_nk", p.build(), ugraph, lambda xs: [xs[1] @ xs[0].T])


def _found(case_id: str, dtype: str):
    from pathlib import Path

    from superopt.ir import check, from_text
    from tests.fixtures.build import Fixture

    text = (Path(__file__).resolve().parent / "ugraphs" / f"{FOUND_CASES[case_id]}.txt").read_text()
    ugraph = check(from_text(text.replace("bfloat16", dtype)))
    return Fixture(case_id, ugraph, ugraph, None)


def _wide(case_id: str, dtype: str):
    from superopt.runtime.retile import retile

    name, kw, grid, forloop = WIDE_CASES[case_id]
    fx = FIXTURES[name](dtype=dtype, **kw)
    g = fx.ugraph
    idx = next(i for i, n in enumerate(g.nodes) if n.op == "customized")
    return dataclasses.replace(fx, ugraph=retile(g, idx, grid, forloop))


def build(case_id: str, dtype: str):
    if case_id in WIDE_CASES:
        return _wide(case_id, dtype)
    if case_id in FOUND_CASES:
        return _found(case_id, dtype)
    if case_id in TEXT_CASES:
        return _gemv_nk(dtype, **TEXT_CASES[case_id])
    for cid, name, kw in CASES:
        if cid == case_id:
            return FIXTURES[name](dtype=dtype, **kw)
    raise KeyError(case_id)
