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


@pytest.mark.parametrize("name", UGRAPHS)
def test_interpreted_the_kernel_writes_the_slots_the_scatters_would(interpreted, name):
    _writes_the_slots_the_scatters_would(interpreted[name], name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", UGRAPHS)
def test_on_the_gpu_the_kernel_writes_the_slots_the_scatters_would(name):
    from tests.superopt.codegen.store_through_run import compare
    _writes_the_slots_the_scatters_would(compare("cuda", name), name)


@pytest.mark.slow
def test_the_storing_kernel_compiles_for_sm90(graph):
    # the slot read as an int64 and the store at an offset lower to sm_90 (no GPU), with PDL as patch() runs it
    from superopt.runtime.aot import aot_compile

    kernels = aot_compile(render_triton(graph, in_place=CACHES, pdl=True), arch=90)
    ptx = kernels["decode_layer_attention_fused_k0"].asm["ptx"]
    assert ".target sm_90" in ptx and "ld.global.b64" in ptx and ptx.count("st.global") >= 2
