"""The 8-row decode GEMV tilings that beat the search (issue 34) reach the profiler's candidates.

On the H100 the hand-written fixtures won every batch-8 projection with wide tiles: 32-64 weight
columns a block, K walked in slices of 128-512, about one wave of blocks
(``benchmarks/results/blocks_h100_2026-11-25_s17.md``; ``benchmarks/fixture_gap.py`` finds them).
The search had thinned them out of its extents (48 columns was no tile size; 32 columns and K 512
fell between the five extents kept per axis), its cost model ranked them far down, and only five
other extents of a design reached the profiler. These tests fail if those tilings drop out again.
"""
from __future__ import annotations

import pytest

from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize
from superopt.search.driver import ALTERNATIVES, _diverse
from superopt.search.instantiate import _pick


def _gemv(rows: int, hidden: int, out: int, residual: bool = False):
    """x [rows, hidden] · Wᵀ (W as nn.Linear holds it, [out, hidden]) [+ r]."""
    p = Program("gemv")
    x = p.input("x", (rows, hidden), "bfloat16")
    w = p.input("w", (out, hidden), "bfloat16")
    y = p.matmul(x, p.transpose(w))
    if residual:
        y = p.add(y, p.input("r", (rows, out), "bfloat16"))
    p.output(y)
    return p.build()


def _shapes(graphs, rows: int, hidden: int) -> set[tuple[int, int, int]]:
    """(columns a block, K a loop iteration, for-loop) of every one-kernel candidate whose block holds
    all ``rows`` rows (the weight tile is the input with a dim of the K slice and no row dim)."""
    out = set()
    for g in graphs:
        nodes = g.customized_nodes()
        if len(nodes) != 1:
            continue
        b = nodes[0].block
        tiles = [i.value.type.shape for i in b.inputs]
        x_tile = next((t for t in tiles if len(t) == 2 and t[0] == rows), None)
        if x_tile is None:
            continue
        k = x_tile[1]
        w_tile = next((t for t in tiles if len(t) == 2 and t[1] == k and t[0] != rows), None)
        if w_tile is not None and hidden % k == 0:
            out.add((w_tile[0], k, b.forloop))
    return out


@pytest.mark.parametrize("hidden,out,residual", [(4096, 4096, True), (896, 1152, False)])
def test_an_8_row_gemv_is_offered_wide_tiles_with_long_k_loops(hidden, out, residual):
    # Llama-3-8B o+residual (won by 32 columns, K 512, 8 iterations) and Qwen2.5-0.5B's qkv width
    # at its hidden size 896 (won by 16 columns, K 128, 7 iterations)
    result = superoptimize(_gemv(8, hidden, out, residual), SearchBudget(max_seconds=30))
    shapes = _shapes(result.candidates(), 8, hidden)
    assert any(cols >= 32 and f >= 7 for cols, _, f in shapes), sorted(shapes)
    if hidden == 4096:
        assert (32, 512, 8) in shapes, sorted(shapes)  # the hand-written winner's own tiling
    else:
        assert (16, 128, 7) in shapes, sorted(shapes)


def test_48_columns_a_block_is_a_grid_extent_of_6144_columns():
    # 6144 columns fill 132 SMs as 128 blocks only with 48 columns a block (Llama-3-8B qkv's winner)
    budget = SearchBudget()
    grid_tiles = (1, 2, 4, 8) + budget.tile_sizes
    assert 6144 // 48 in _pick(6144, grid_tiles)
    assert {4096 // 32, 4096 // 64} <= set(_pick(4096, grid_tiles))
    # every K slice of the loop tiles is kept, 512 among them (o and down projections)
    assert {4096 // k for k in budget.loop_tile_sizes} == set(_pick(4096, budget.loop_tile_sizes))


class _Block:
    def __init__(self, blocks: int, forloop: int, grid=None):
        self.num_blocks, self.forloop = blocks, forloop
        self.grid = grid or (blocks, 1, 1)


class _Node:
    def __init__(self, blocks: int, forloop: int, grid=None):
        self.block = _Block(blocks, forloop, grid)


def test_diverse_keeps_the_few_waves_band_however_it_is_costed():
    # options (node, cost, extents, on the sparse lattice), cheapest first: the model prefers 1024
    # and 2048 blocks (the sparse lattice's); 64-256 blocks (the dense lattice's) come last, as
    # the wide tiles did
    opts = [(_Node(1024, f), 10 + f, None, True) for f in (4, 8, 16)]
    opts += [(_Node(2048, f), 20 + f, None, True) for f in (4, 8, 16, 32)]
    opts += [(_Node(blocks, f), 100 + blocks / 64 + f, None, False) for blocks in (64, 128, 256) for f in (8, 16, 32)]
    kept = [(o[0].block.num_blocks, o[0].block.forloop) for o in _diverse(opts, sms=132)]
    # the cost-best shapes of the sparse lattice first, as before
    assert kept[:ALTERNATIVES + 1] == [(1024, 4), (1024, 8), (1024, 16), (2048, 4), (2048, 8), (2048, 16)]
    for blocks in (64, 128, 256):
        # the cheapest loop of each band count, and (no loop of half its iterations here) the next
        assert (blocks, 8) in kept and (blocks, 16) in kept
        assert (blocks, 32) not in kept
    assert len(kept) == len(set(kept)) == ALTERNATIVES + 1 + 6


def test_an_8_row_gated_mlp_is_offered_its_hand_written_tiling():
    # paper GatedMLP (W [K, N]): 64 columns a block, K in slices of 256 — two [256, 64] weight
    # tiles that the cost model charges twice the time of [128, 64] ones; it won on the H100
    p = Program("gated")
    x = p.input("x", (8, 4096), "bfloat16")
    w1 = p.input("w1", (4096, 4096), "bfloat16")
    w2 = p.input("w2", (4096, 4096), "bfloat16")
    p.output(p.mul(p.silu(p.matmul(x, w1)), p.matmul(x, w2)))
    result = superoptimize(p.build(), SearchBudget(max_seconds=30))
    found = set()
    for g in result.candidates():
        if len(g.customized_nodes()) == 1:
            node = g.customized_nodes()[0]
            found.add((node.block.num_blocks, node.block.forloop,
                       tuple(sorted(tuple(i.value.type.shape) for i in node.block.inputs))))
    assert (64, 16, ((8, 256), (256, 64), (256, 64))) in found, sorted(found)


def test_diverse_offers_a_split_kernels_band_count_on_a_second_grid():
    # a split kernel's 256 blocks as 4 head groups × 64 KV splits (cheapest) or 8 × 32 (the
    # hand-written decode attention at 32k, one row, a few % dearer at the same loop): the
    # second grid takes the count's second place, before the loop of half the iterations
    opts = [(_Node(4096, 1, (8, 512, 1)), 10.0, None, True)]
    opts += [(_Node(256, 16, (4, 64, 1)), 11.0, None, False), (_Node(256, 16, (8, 32, 1)), 11.3, None, False),
             (_Node(256, 8, (4, 64, 1)), 11.5, None, False)]
    kept = [(o[0].block.grid, o[0].block.forloop) for o in _diverse(opts, sms=132, split=True)]
    assert kept == [((8, 512, 1), 1), ((4, 64, 1), 16), ((8, 32, 1), 16)]
    # a one-kernel design keeps the half loop there (Qwen2.5-0.5B qkv at 8 rows was won by one)
    kept = [(o[0].block.grid, o[0].block.forloop) for o in _diverse(opts, sms=132)]
    assert kept == [((8, 512, 1), 1), ((4, 64, 1), 16), ((4, 64, 1), 8)]
