"""The cost model's loads-in-flight term: a decode GEMV ranks wide K-slices above narrow ones."""
from __future__ import annotations

import pytest

from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize
from superopt.runtime.retile import retile
from superopt.search.cost import INFLIGHT_BYTES, graph_cost, streaming_fraction


def test_streaming_fraction_follows_bytes_in_flight_per_sm():
    # 256 blocks of 128 threads on 132 SMs: ~1.9 resident per SM
    narrow = streaming_fraction(256, 128, 4 * 256 * 2, 132)     # [4, 256] bf16 weight tile
    wide = streaming_fraction(256, 128, 4 * 1024 * 2, 132)      # [4, 1024]
    assert narrow == pytest.approx(256 / 132 * 2048 / INFLIGHT_BYTES)
    assert wide == pytest.approx(min(1.0, 256 / 132 * 8192 / INFLIGHT_BYTES))
    assert narrow < 0.5 and wide > 0.9
    # a grid smaller than the GPU: each busy SM holds one block; residency is capped by threads
    assert streaming_fraction(8, 128, 8192, 132) == pytest.approx(0.5)
    assert streaming_fraction(10_000, 1024, 4096, 132) == pytest.approx(2 * 4096 / INFLIGHT_BYTES)


def test_decode_gemv_search_prefers_slices_that_keep_weights_streaming():
    # without the term, the [4 columns, 256 of K] tiling ranked first: 0.78 TB/s on the H200
    p = Program("k_proj")
    x = p.input("x", (1, 4096), "bfloat16")
    norm_weight = p.input("norm_weight", (4096,), "bfloat16")
    w = p.input("w", (1024, 4096), "bfloat16")
    p.output(p.matmul(p.rms_norm(x, norm_weight, eps=1e-5), p.transpose(w)))  # RMSNorm + k_proj
    result = superoptimize(p.build(), SearchBudget(max_seconds=30))
    (node,) = result.best.customized_nodes()
    weight_tile = max((i.value.type for i in node.block.inputs), key=lambda t: t.numel)
    per_iteration = weight_tile.numel * 2
    assert per_iteration >= 4096, (node.block.grid, node.block.forloop, weight_tile)
    # the same design walking K in 256-wide slices (16 iterations) is estimated slower
    index = result.best.nodes.index(node)
    narrow = retile(result.best, index, node.block.grid, 4096 // 256)
    assert graph_cost(narrow) > 1.5 * graph_cost(result.best)
