"""ir.chain: which customized op may run its consumer in its last blocks, and how the grids map."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from superopt.ir import from_text
from superopt.ir.chain import chain_of, chains
from superopt.runtime.retile import retile
from tests.fixtures.ugraphs import FIXTURES

UGRAPHS = Path(__file__).resolve().parents[1] / "codegen" / "ugraphs"


def test_decode_attention_groups_the_splits_of_a_kv_head_and_loops_over_its_query_heads():
    # split kernel grid (batch 3, kv heads 2, splits); combine grid (batch 3, kv heads 2, group 4)
    g = FIXTURES["decode_attention"](batch=3, q_heads=8, kv_heads=2, head_dim=16, kv_len=256).ugraph
    split, combine = (i for i, n in enumerate(g.nodes) if n.op == "customized")
    c = chain_of(g, split)
    splits = g.nodes[split].block.grid[2]
    assert splits > 1
    assert (c.producer, c.consumer) == (split, combine)
    assert c.matched == ((0, 0), (1, 1)) and c.free == (2,)
    assert (c.groups, c.parts) == (3 * 2, splits)
    assert c.from_producer == ((0, 0), (1, 1), (2, 2)) and c.extra_args == ()


def test_paper_gqa_matches_heads_and_query_tiles():
    g = FIXTURES["gqa"](batch=2, q_len=128, head_dim=16, kv_len=256).ugraph  # 4 heads, 2 query tiles
    (c,) = chains(g).values()
    a = g.nodes[c.producer].block
    assert c.matched == ((0, 0), (2, 2)) and c.free == ()
    assert (c.groups, c.parts) == (4 * 2, a.grid[1])


def test_a_consumer_block_chains_where_it_reads_whole_producer_blocks():
    g = FIXTURES["gqa"](batch=2, q_len=16, head_dim=16, kv_len=256).ugraph   # the split kernel cuts 4 heads
    combine = max(i for i, n in enumerate(g.nodes) if n.op == "customized")
    split = g.nodes[combine - 1].block
    assert chain_of(g, combine - 1).ratios == ()
    paired = retile(g, combine, (2, 1, 1), 1)  # the combine takes two heads a block: two split blocks' worth
    c = chain_of(paired, combine - 1)
    assert c.matched == ((0, 0),) and c.ratios == (2,) and c.ratio(0) == 2
    assert (c.groups, c.parts) == (2, 2 * split.grid[1])
    coarse = retile(g, combine - 1, (2, split.grid[1], 1), split.forloop)  # the split takes two heads, the combine one
    assert chain_of(coarse, combine - 1) is None
    one_block = retile(g, combine, (1, 1, 1), 1)  # one combine block for all: every split block is in its group
    c = chain_of(one_block, combine - 1)
    assert (c.groups, c.parts, c.matched, c.free) == (1, g.nodes[combine - 1].block.num_blocks, (), ())


def test_a_producer_whose_outputs_are_read_elsewhere_does_not_chain():
    g = FIXTURES["decode_attention"](dtype="float32").ugraph
    split = next(i for i, n in enumerate(g.nodes) if n.op == "customized")
    exposed = dataclasses.replace(g, outputs=g.outputs + (g.nodes[split].outs[2].name,), _types=None)
    assert chain_of(g, split) is not None and chain_of(exposed, split) is None


def test_a_split_k_producer_chains_with_its_summed_axes_gathered():
    summed = from_text((UGRAPHS / "qwen05b_attn_in_1_m1.txt").read_text())  # split-K over 112 blocks, then one block
    (c,) = chains(summed).values()
    assert (c.matched, c.free, c.groups, c.parts) == ((), (), 1, 112)
    residual = from_text((UGRAPHS / "split_k_then_residual.txt").read_text())  # grid 8×4 summed over y; then 2×2
    (c,) = chains(residual).values()
    assert c.matched == ((0, 0),) and c.ratios == (4,) and c.free == (1,)
    assert (c.groups, c.parts) == (2, 4 * 4)


def test_graphs_of_one_kernel_have_no_chain():
    for name in ("llama_qkv", "matmul_residual", "rmsnorm_gated_mlp"):
        assert chains(FIXTURES[name](dtype="float32").ugraph) == {}
