"""ir.registers: launches whose tiles would spill (and build for minutes) are not built."""
from __future__ import annotations

from superopt.ir.registers import MAX_VALUES_PER_THREAD, registers_fit, values_per_thread
from superopt.runtime.retile import retile
from tests.fixtures.ugraphs import FIXTURES


def test_whole_rows_of_ntrans_b8_in_one_block_do_not_fit_but_two_rows_a_block_do():
    g = FIXTURES["ntrans"](rows=64, hidden=4096, dtype="bfloat16").ugraph  # 32 blocks of [2, 4096]
    (idx,) = [i for i, n in enumerate(g.nodes) if n.op == "customized"]
    assert values_per_thread(g.nodes[idx].block, 4) == 2 * 4096 // 128
    assert registers_fit(g) and registers_fit(g, 2)
    # the search's one- and two-block designs: 64 / 32 rows of 4096 a block took 36-143 s to build
    for blocks, rows in ((1, 64), (2, 32)):
        wide = retile(g, idx, (blocks, 1, 1), 1)
        assert values_per_thread(wide.nodes[idx].block, 4) == rows * 4096 // 128 > MAX_VALUES_PER_THREAD
        assert not registers_fit(wide) and not registers_fit(wide, 4)
    assert registers_fit(retile(g, idx, (8, 1, 1), 1), 8)  # 8 rows a block on 8 warps: 128 a thread


def test_the_widest_winning_tile_so_far_fits():
    # Llama-3-8B o+res b8 on an H100 and H200: [32, 512] weight tiles (and [16, 512] padded rows of x) on 2 warps
    g = FIXTURES["matmul_residual"](rows=8, hidden=4096, out=4096, dtype="bfloat16").ugraph
    win = retile(g, 0, (1, 128, 1), 8)
    assert values_per_thread(win.nodes[0].block, 2) == 32 * 512 // 64
    assert registers_fit(win, 2)


def test_the_profiler_skips_a_launch_that_does_not_fit_with_the_reason():
    from superopt.codegen.launch import Launch
    from superopt.runtime.profile import fits

    g = FIXTURES["ntrans"](rows=64, hidden=4096, dtype="bfloat16").ugraph
    wide = retile(g, 0, (1, 1, 1), 1)
    assert fits(g, None) and fits(g, Launch(2, 3)) and not fits(wide, None) and not fits(wide, Launch(8, 3))
