"""Rendered Triton source: snapshots per fixture, determinism, and ahead-of-time builds for sm_90.

Snapshots live in tests/golden/codegen/<case>.txt; after an intended renderer change, rewrite
them with ``SUPEROPT_UPDATE_GOLDEN=1 pytest tests/superopt/codegen/test_triton_render.py`` and review the diff.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from superopt.codegen.triton import render_triton
from superopt.ir import from_text, to_text
from superopt.runtime.retile import retile
from tests.fixtures.ugraphs import FIXTURES
from tests.superopt.codegen.triton_cases import CASES, build

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "codegen"
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", IDS)
def test_rendered_source_matches_snapshot(case):
    g = build(case, "float32").ugraph
    src = render_triton(g).source
    path = GOLDEN / f"triton_{case}.txt"
    if os.environ.get("SUPEROPT_UPDATE_GOLDEN") == "1":
        path.write_text(src)
    assert path.exists(), f"no snapshot {path.name}; run with SUPEROPT_UPDATE_GOLDEN=1 and review it"
    assert src == path.read_text(), f"rendered source of {case} changed; review and update the snapshot"


@pytest.mark.parametrize("case", IDS)
def test_one_kernel_per_customized_op_and_deterministic(case):
    g = build(case, "bfloat16").ugraph
    tm = render_triton(g)
    assert len(tm.kernels) == len(g.customized_nodes())
    assert tm.source.count("@triton.jit") == len(g.customized_nodes())
    assert render_triton(from_text(to_text(g))).source == tm.source


def test_bfloat16_source_feeds_dot_in_bfloat16():
    from tests.fixtures.ugraphs import FIXTURES

    src = render_triton(FIXTURES["rmsnorm_matmul"](dtype="bfloat16", rows=16).ugraph).source
    assert "tl.dot(" in src and 'input_precision="ieee"' not in src
    assert "tl.float32" in src  # accumulators


def test_small_m_matmul_is_a_broadcast_product_summed_after_the_loop():
    # 2 rows: tl.dot would pad M to 16; the products accumulate elementwise, one tl.sum after the loop
    src = render_triton(build("rmsnorm_matmul", "bfloat16").ugraph).source
    assert "tl.dot(" not in src and "tl.arange(0, 16)" not in src
    body = src.split("for i in range")[1].split("\n    v")[0]
    assert "tl.sum" not in body
    # x @ W^T with W [N, K]: W's tiles are read as loaded, K contiguous, never transposed, and the
    # products stay 2-D in the loaded layout: [1, K] (one output a block) or [N, K] (a row of outputs)
    for case, final in (("gemv_nk", "tl.sum(v0_v2_el, axis=1, keep_dims=True)"),
                        ("gemv_nk_cols", "tl.sum(v0_v2_el, axis=1)[None, :]")):
        gemv = render_triton(build(case, "bfloat16").ugraph).source
        assert "tl.trans(" not in gemv and "None, :, :]" not in gemv and final in gemv


def test_transposed_tile_read_only_by_dots_stays_in_its_loaded_dtype():
    # decode attention's K [KV tile, d]: transposed as loaded for q·Kᵀ (the flash-attention form);
    # widening it to float32 first doubled the layout conversion's shared memory and registers
    src = render_triton(build("decode_attention", "bfloat16").ugraph).source
    assert "v7_ktt = tl.permute(v5_kt_in, (0, 1, 3, 2))" in src and "v5_kt_in.to(tl.float32)" not in src
    assert "tl.reshape(v7_ktt, [16, 32])" in src  # fed to the dot as it is, no cast back


@pytest.mark.slow
def test_decode_gemv_loop_has_no_barrier_or_shared_memory():
    # Qwen2.5-0.5B mlp_out at m=1 (55 µs on the H200 as a padded tl.dot): each iteration is now two
    # global loads and FMAs; one cross-warp reduction after the loop
    from superopt.runtime.aot import aot_compile

    g = from_text((Path(__file__).resolve().parent / "ugraphs" / "qwen05b_mlp_out_m1.txt").read_text())
    (k,) = aot_compile(render_triton(g), arch=90, num_warps=4).values()
    ptx = k.asm["ptx"]
    loop = ptx[ptx.index("Inner Loop"):]
    loop = loop[:loop.index("bra")]
    assert "ld.global" in loop and "bar.sync" not in loop and ".shared" not in loop
    assert k.metadata.shared <= 64


def test_few_row_dot_over_wide_tiles_accumulates_transposed_with_the_weight_as_loaded():
    # Llama qkv at 5 rows, 65-column tiles: Σ W[N,K]-tile · xᵀ, one transpose after the loop; the
    # [N, K] weight tile feeds the dot as loaded (no float32 copy, no transpose of it)
    src = render_triton(build("llama_qkv_wide", "bfloat16").ugraph).source
    loop = src[src.index("for i in range"):src.index("\n    v", src.index("for i in range"))]
    assert "tl.dot(v5_wt_nk_in, tl.trans(" in loop and "wt_nk = " not in src
    assert src.count("tl.trans(") == 2 and "v2_acc = tl.trans(v2_acc_t)" in src
    narrow = render_triton(build("llama_qkv", "bfloat16").ugraph).source  # 32-column tiles: x · W as before
    assert "_t = tl.full" not in narrow


def test_two_few_row_dots_on_one_operand_run_as_one_dot_on_their_stacked_weight_tiles():
    # gate and up, 32 rows each: one [64, K] load (a pointer select between the two weights) and one swapped dot,
    # split back after the loop; with 16-row tiles (32 together) or an odd extent (padded) they stay two dots
    src = render_triton(build("rmsnorm_gated_mlp_stacked", "bfloat16").ugraph).source
    loop = src[src.index("for i in range"):src.index("\n    v", src.index("for i in range"))]
    assert loop.count("tl.dot(") == 1 and "tl.load(tl.where(tl.arange(0, 64)[:, None] < 32, a2_ptr" in loop
    assert "_st = tl.full([64, 16]" in src and src.count("tl.split(") == 1
    for kw in (dict(inter=48), dict(inter=90)):  # 16-row tiles; 30-row tiles padded to 32
        fx = FIXTURES["rmsnorm_gated_mlp"](dtype="bfloat16", rows=5, hidden=96, **kw)
        idx = next(i for i, n in enumerate(fx.ugraph.nodes) if n.op == "customized")
        other = render_triton(retile(fx.ugraph, idx, (1, 3, 1), 3)).source
        assert "tl.split(" not in other and other.count("tl.dot(") == 2


def test_a_sum_scaled_inside_the_loop_is_deferred_and_scaled_once_after_it():
    # Σ_i (r_i / c) = (Σ_i r_i) / c: the squares summed elementwise, one reduction and one division after the loop
    # (a cross-warp reduction every iteration otherwise); c · r too, never c / r
    text = (Path(__file__).resolve().parent / "ugraphs" / "sum_of_squares_scaled_in_the_loop.txt").read_text()
    scaled = render_triton(from_text(text)).source
    loop = scaled[scaled.index("for i in range"):scaled.index("\n    v", scaled.index("for i in range"))]
    assert "_el = " in loop and "tl.sum(" not in loop and " / " not in loop
    assert "_v8" not in scaled and "v11 = (v2_v11 / v0_v0)" in scaled
    left = render_triton(from_text(text.replace("div(%v3, %v0)", "mul(%v0, %v3)"))).source
    assert "v11 = (v0_v0 * v2_v11)" in left
    inverse = render_triton(from_text(text.replace("div(%v3, %v0)", "div(%v0, %v3)"))).source
    loop = inverse[inverse.index("for i in range"):inverse.index("\n    v", inverse.index("for i in range"))]
    assert "tl.sum(" in loop and "_v8 = (v0_v0 / " in loop


@pytest.mark.slow
def test_stacked_dots_build_to_one_wgmma():
    from superopt.runtime.aot import aot_compile

    (k,) = aot_compile(render_triton(build("rmsnorm_gated_mlp_stacked", "bfloat16").ugraph), arch=90,
                       num_warps=4).values()
    assert "wgmma.mma_async" in k.asm["ptx"] and "mma.sync" not in k.asm["ptx"]


@pytest.mark.slow
def test_few_row_dot_over_wide_tiles_builds_to_wgmma():
    # (W·xᵀ)ᵀ: the weight tile's 64+ rows make the dot a warpgroup MMA on sm_90 (x · W on 16 padded
    # rows builds to mma.sync, at half the weight-streaming rate with an RMSNorm in the loop)
    from superopt.runtime.aot import aot_compile

    (k,) = aot_compile(render_triton(build("llama_qkv_wide", "bfloat16").ugraph), arch=90, num_warps=4).values()
    assert "wgmma.mma_async" in k.asm["ptx"] and "mma.sync" not in k.asm["ptx"]


@pytest.mark.slow
def test_cross_block_sums_add_with_relaxed_atomics_ordered_by_one_acq_rel_count():
    # Triton's default acq_rel made every 16-byte add a returning atomic waiting on earlier memory
    # operations; fire-and-forget reductions, then one acquire-release count per block
    from superopt.runtime.aot import aot_compile

    (k,) = aot_compile(render_triton(build("rmsnorm_matmul_split_k", "bfloat16").ugraph), arch=90).values()
    ptx = k.asm["ptx"]
    assert "red.global.gpu.relaxed.add" in ptx
    assert ptx.count(".acq_rel.") == ptx.count("atom.global.gpu.acq_rel.add.u32") == 1


@pytest.mark.slow
@pytest.mark.parametrize("case", IDS)
def test_every_kernel_compiles_for_sm90(case):
    from superopt.runtime.aot import aot_compile

    tm = render_triton(build(case, "bfloat16").ugraph)
    kernels = aot_compile(tm, arch=90)
    assert set(kernels) == {k.name for k in tm.kernels}
    for k in kernels.values():
        assert k.asm["cubin"] and ".target sm_90" in k.asm["ptx"]


LOOPED = [c for c in IDS if any(n.block.forloop > 1 for n in build(c, "float32").ugraph.customized_nodes())]


def test_prefetch_loads_the_next_tiles_before_the_work_and_leaves_loopless_kernels_alone():
    g = build("gemv_nk_odd", "bfloat16").ugraph
    name = render_triton(g).kernels[0].name
    plain, ahead = render_triton(g).source, render_triton(g, frozenset({name})).source
    body = ahead[ahead.index("for i in range(3):"):]
    # the tiles of iteration i+1 (wrapping to 0) are loaded before iteration i's products
    assert body.index("((i + 1) % 3) * 30") < body.index(" * (")
    assert ahead.count("tl.load(") == 2 * plain.count("tl.load(")
    assert "_next = tl.load(" in ahead[:ahead.index("for i in range(3):")]  # iteration 0, before the loop
    loopless = next(c for c in IDS if c not in LOOPED)
    g2 = build(loopless, "bfloat16").ugraph
    names = frozenset(k.name for k in render_triton(g2).kernels)
    assert render_triton(g2, names).source == render_triton(g2).source


@pytest.mark.slow
@pytest.mark.parametrize("case", LOOPED)
def test_prefetched_kernels_compile_for_sm90(case):
    from superopt.runtime.aot import aot_compile

    g = build(case, "bfloat16").ugraph
    tm = render_triton(g, frozenset(k.name for k in render_triton(g).kernels))
    kernels = aot_compile(tm, arch=90)
    assert set(kernels) == {k.name for k in tm.kernels}
    for k in kernels.values():
        assert k.asm["cubin"] and ".target sm_90" in k.asm["ptx"]


def test_paired_rendering_takes_every_pointer_twice_and_runs_the_second_set_on_a_free_grid_axis():
    g = build("found_kv_split_k", "bfloat16").ugraph  # two kernels, one summed across blocks
    plain, paired = render_triton(g), render_triton(g, paired=True)
    for p, q in zip(plain.kernels, paired.kernels):
        free = next(a for a in range(3) if p.grid[a] == 1)
        assert q.paired and q.grid == tuple(2 if a == free else n for a, n in enumerate(p.grid))
        body = paired.source[paired.source.index(f"def {q.name}("):]
        assert f"if tl.program_id({free}) == 1:" in body.splitlines()[1]
        assert "a0_ptr = a0_ptr_b" in body and "o0_ptr = o0_ptr_b" in body
    launcher = paired.source[paired.source.index("def launch_"):]
    assert launcher.splitlines()[0].count("_b: torch.Tensor") == launcher.splitlines()[0].count(": torch.Tensor") // 2
    assert render_triton(g).source == plain.source  # the plain rendering is unchanged


@pytest.mark.slow
@pytest.mark.parametrize("case", IDS)
def test_paired_kernels_compile_for_sm90_with_the_same_vector_loads(case):
    from superopt.runtime.aot import aot_compile

    g = build(case, "bfloat16").ugraph
    plain, paired = aot_compile(render_triton(g), arch=90), aot_compile(render_triton(g, paired=True), arch=90)
    for name, k in paired.items():
        ptx, ref = k.asm["ptx"], plain[name].asm["ptx"]
        assert k.asm["cubin"] and ".target sm_90" in ptx
        # the pointers chosen at run time keep their 16-byte alignment: loads as wide as the plain kernel's
        for width in ("ld.global.v4", "ld.global.v2"):
            assert ptx.count(width) == ref.count(width), (name, width)


def test_only_the_chain_cases_have_a_kernel_that_can_run_its_consumer():
    from superopt.ir.chain import chains
    from tests.superopt.codegen.triton_cases import CHAIN_CASES

    assert {c for c in IDS if chains(build(c, "float32").ugraph)} == set(CHAIN_CASES)


def test_chained_split_kernel_runs_the_combine_in_the_last_block_of_each_group():
    g = build("decode_attention", "bfloat16").ugraph  # grid (1, 2 kv heads, 2 splits); combine (1, 2, 2 q heads)
    plain = render_triton(g)
    split, combine = plain.kernels
    tm = render_triton(g, chain=frozenset({split.name}))
    (k,) = tm.kernels
    assert k.name == split.name and k.tail == combine.node_index and k.counters == 2  # one counter a kv head
    assert k.args == split.args and k.outs == split.outs + combine.outs
    body = tm.source[tm.source.index(f"def {k.name}("):tm.source.index("def launch_")]
    count = 'if tl.atomic_add(c_ptr + pid1, 1, sem="acq_rel", scope="gpu") == 1:'
    assert body.index("tl.debug_barrier()") < body.index(count) < body.index("for tpid2 in range(2):")
    # the partials are read at L2 by the last block; the counter is reset for the next launch
    assert body.count('cache_modifier=".cg"') == 3 and body.rstrip().endswith("tl.store(c_ptr + pid1, 0)")
    assert "o3_ptr" in body[body.index(count):]  # the combine's output, after the split's three
    assert render_triton(g, chain=frozenset({combine.name})).source == plain.source  # the consumer cannot chain
    assert render_triton(g, chain=frozenset({split.name}), paired=True).source == render_triton(g, paired=True).source


@pytest.mark.slow
@pytest.mark.parametrize("case", ["decode_attention", "gqa"])
def test_chained_kernels_compile_for_sm90_with_l2_loads_of_the_partials(case):
    from superopt.runtime.aot import aot_compile

    g = build(case, "bfloat16").ugraph
    tm = render_triton(g, chain=frozenset(k.name for k in render_triton(g).kernels))
    (k,) = aot_compile(tm, arch=90).values()
    ptx = k.asm["ptx"]
    assert k.asm["cubin"] and ".target sm_90" in ptx
    assert "ld.global.cg" in ptx and ptx.count("atom.global.gpu.acq_rel.add") == 1
