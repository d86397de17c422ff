"""The cost model's constants fitted to measured times: the fit recovers an ordering the defaults miss,
stores per arch, and the search ranks with what it reads back (``superopt.search.fit``)."""
from __future__ import annotations

import json
import math

import pytest

from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize
from superopt.search.cost import DEFAULT_PARAMS, CostParams, graph_cost, load_params
from superopt.search.fit import fit, graph_features, kept_rows, rank_correlation, save_fit, score


def _candidates(rows: int, hidden: int, out: int):
    p = Program("gemv")
    x = p.input("x", (rows, hidden), "bfloat16")
    w = p.input("w", (out, hidden), "bfloat16")
    p.output(p.matmul(x, p.transpose(w)))
    return superoptimize(p.build(), SearchBudget(max_seconds=30)).candidates()


def test_rank_correlation_with_ties():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 1, 2], [5, 6, 7]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(rank_correlation([1], [2]))


def test_fit_recovers_the_ordering_of_other_constants():
    # "measured" times from a GPU whose SMs each draw 3x their share and whose tiles may be twice
    # as large: the defaults order these candidates worse than the fitted constants do
    truth = CostParams(sm_share=3.0, tile_elems=16384, inflight_bytes=24576)
    rows = []
    for shape in ((8, 4096, 4096), (8, 896, 1152), (3, 1216, 448)):
        cands = _candidates(*shape)
        rows.append([(graph_features(g), graph_cost(g, params=truth)) for g in cands])
        assert len(rows[-1]) >= 10
    fitted, before, after = fit(rows)
    assert before < 0.97 and after > before + 0.02 and after == pytest.approx(score(rows, fitted))
    assert after > 0.97


def test_fitted_constants_are_stored_per_arch_and_read_back(tmp_path):
    rows = [[(graph_features(g), graph_cost(g) * (1 + 0.1 * i)) for i, g in enumerate(_candidates(8, 896, 1152))]]
    path = tmp_path / "cost_fit.json"
    other = CostParams(sm_share=2.0)
    save_fit(path, "sm_80", other, rows, 0.1, 0.2)
    fitted, before, after = fit(rows)
    save_fit(path, "sm_90", fitted, rows, before, after, keep_rows=4)
    assert load_params(path, "sm_90") == fitted and load_params(path, "sm_80") == other
    assert load_params(path, "sm_89") is None and load_params(tmp_path / "none.json", "sm_90") is None
    back = kept_rows(path, "sm_90")
    assert len(back) == 1 and score(back, fitted) == pytest.approx(after)
    data = json.loads(path.read_text())
    data["sm_90"]["params"]["sm_share"] = -1.0  # a tampered file: refused, not used
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError):
        load_params(path, "sm_90")


def test_the_search_ranks_with_the_constants_it_is_given():
    p = Program("gemv")
    x = p.input("x", (8, 4096), "bfloat16")
    w = p.input("w", (4096, 4096), "bfloat16")
    p.output(p.matmul(x, p.transpose(w)))
    program = p.build()
    plain = superoptimize(program, SearchBudget(max_seconds=30))
    share = superoptimize(program, SearchBudget(max_seconds=30, cost_params=CostParams(sm_share=4.0)))
    # four shares an SM: a grid of a third of a wave costs what a full wave does
    assert share.ranked[0][1] < plain.ranked[0][1]
    blocks = lambda r: r.best.customized_nodes()[0].block.num_blocks
    assert blocks(share) <= blocks(plain)
    assert DEFAULT_PARAMS == CostParams()
