"""A cache write stored by the kernel that computes the row (``codegen.store_through``): which scatters are
lowered, how the kernel stores, and (Triton's interpreter, its own process) the same values as library
scatters with one launch fewer.

The μGraphs are the search's best for two decode-attention programs (``store_through_run.UGRAPHS``), kept as
text so no test searches for them."""
from __future__ import annotations

from pathlib import Path

import pytest

from superopt.codegen.store_through import StoreThrough, stores_through
from superopt.codegen.triton import render_triton
from superopt.ir import from_text
from tests.interpreter import run_interpreted
from tests.superopt.codegen.store_through_run import UGRAPHS

UGRAPH = Path(__file__).resolve().parent / "ugraphs" / "decode_attention_b2_q4_kv2_d16_L32.txt"
CACHES = frozenset({"k_cache", "v_cache"})


@pytest.fixture(scope="module")
def graph():
    return from_text(UGRAPH.read_text())


def test_the_rope_kernel_stores_the_key_row_and_copies_the_value_row(graph):
    # k's row comes out of the RoPE kernel (node 0): stored by it; v's is an input of k's shape at the same
    # slot: copied by the same kernel, tile for tile
    assert stores_through(graph, CACHES) == (StoreThrough(2, 0, 0, "k_cache", "pos", 2),
                                             StoreThrough(3, 0, 0, "v_cache", "pos", 2, copied="v"))
    tm = render_triton(graph, in_place=CACHES)
    spec = next(s for s in tm.kernels if s.node_index == 0)
    assert spec.outs == ("k_cache", "v_cache") and spec.args[-2:] == ("pos", "v")
    src = tm.source
    assert "slot0 = tl.load(a3_ptr)" in src and "(o0_ptr + slot0 * 16) + " in src  # a slot is 16 floats
    assert "copy1 = tl.load(a4_ptr + " in src and "tl.store((o1_ptr + slot0 * 16) + " in src


def test_nothing_is_lowered_without_in_place_or_for_an_excluded_kernel(graph):
    assert stores_through(graph, ()) == () and render_triton(graph).stored == ()
    assert stores_through(graph, CACHES, excluded=frozenset({0})) == ()
    assert stores_through(graph, {"v_cache"}) == ()  # no kernel stores a row at that slot to copy it beside
    assert render_triton(graph, in_place=CACHES, paired=True).stored == ()


def test_a_row_with_another_reader_is_not_lowered(graph):
    # the row is also a graph output: the kernel must keep writing it where its reader finds it (and so
    # has no stored row for v's to be copied beside)
    text = UGRAPH.read_text().replace("output %t30 %t15 %t16", "output %t30 %t15 %t16 %t14")
    assert stores_through(from_text(text), CACHES) == ()


def test_the_last_kernel_counts_calls_where_it_reads_no_position(graph):
    tm = render_triton(graph, in_place=CACHES, counted="pos")
    last = tm.kernels[-1]
    assert tm.counting == last.node_index and last.counts and last.params()[-1] == "n"
    assert [s.counts for s in tm.kernels[:-1]] == [False] * (len(tm.kernels) - 1)
    assert "tl.store(n_ptr, tl.load(n_ptr) + 1)" in tm.source
    # its counter could be the mask it reads, or the graph runs paired: the caller counts after the graph
    assert render_triton(graph, in_place=CACHES, counted="mask").counting is None
    assert render_triton(graph, in_place=CACHES, counted="pos", paired=True).counting is None
    assert render_triton(graph, in_place=CACHES).counting is None and "n_ptr" not in render_triton(graph).source


def test_a_library_op_after_the_last_kernel_leaves_the_count_to_the_caller(graph):
    # a node launched after the last kernel could read the counter after the kernel advanced it
    from superopt.codegen.counted import counting_kernel
    text = UGRAPH.read_text()
    last = max(i for i, n in enumerate(graph.nodes) if n.op == "customized")
    launched = {last: ("t15",)}
    assert counting_kernel(graph, "pos", launched) == last
    assert counting_kernel(graph, "pos", {last: ("pos",)}) is None
    extra = from_text(text.replace("output %t30 %t15 %t16", "%t99 = neg(%t30) : float32[2,4,1,16]\n"
                                   "output %t99 %t15 %t16"))
    assert counting_kernel(extra, "pos", launched) is None


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted("-m", "tests.superopt.codegen.store_through_run")


def _writes_the_slots_the_scatters_would(r: dict, name: str) -> None:
    assert r["stored"] == ["k_cache", "v_cache"]
    plain, lowered = r["launches"]
    assert lowered == plain - 2
    assert len(r["steps"]) == 2 * len(UGRAPHS[name])  # each position: a plain and a bound call
    for step in r["steps"]:
        assert all(step[k] for k in ("outputs_equal", "caches_are_inputs", "caches_written", "other_slots_kept")), step
    assert "k_cache is written in place by a kernel and must be contiguous" in r["strided_refused"]
    # the call counter: in the last kernel (no launch of its own) where that kernel reads no position, else after
    assert r["counted_launches"] == [lowered, lowered + 1]
    assert len(r["counted"]) == 3 * len(UGRAPHS[name])
    for step in r["counted"]:
        assert all(step[k] for k in ("outputs_equal", "caches_written", "advanced")), step


@pytest.mark.parametrize("name", UGRAPHS)
def test_interpreted_the_kernel_writes_the_slots_the_scatters_would(interpreted, name):
    _writes_the_slots_the_scatters_would(interpreted[name], name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", UGRAPHS)
def test_on_the_gpu_the_kernel_writes_the_slots_the_scatters_would(name):
    from tests.superopt.codegen.store_through_run import compare
    _writes_the_slots_the_scatters_would(compare("cuda", name), name)


@pytest.mark.slow
def test_the_storing_and_counting_kernels_compile_for_sm90(graph):
    # the slot read as an int64 and the store at an offset lower to sm_90 (no GPU), with PDL as patch() runs it,
    # and so does the call counter's add in the last kernel
    from superopt.runtime.aot import aot_compile

    kernels = aot_compile(render_triton(graph, in_place=CACHES, pdl=True, counted="pos"), arch=90)
    ptx = kernels["decode_layer_attention_fused_k0"].asm["ptx"]
    assert ".target sm_90" in ptx and "ld.global.b64" in ptx and ptx.count("st.global") >= 2
    # the last kernel's count: an int64 loaded, one added, stored back
    counting = kernels["decode_layer_attention_fused_k4"].asm["ptx"]
    assert "ld.global.b64" in counting and "st.global.b64" in counting
