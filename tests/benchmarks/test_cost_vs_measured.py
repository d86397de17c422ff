"""benchmarks/cost_vs_measured.py: the cost model's ranking against the profiler's, per cache entry."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "cost_vs_measured.py"
_spec = importlib.util.spec_from_file_location("cost_vs_measured", _PATH)
cvm = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cvm
_spec.loader.exec_module(cvm)


def test_rank_correlation_is_one_for_the_same_order_and_minus_one_reversed():
    assert cvm.rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert cvm.rank_correlation([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)


def test_summary_compares_the_cost_models_pick_with_the_fastest(tmp_path, capsys):
    rows = [["grid 4x1x1", "w2s3", 9.0, 1.0],     # the cost model's pick, 3x the fastest
            ["grid 8x1x1", "w4s3p", 3.0, 2.0],
            ["grid 16x1x1", "w2s3", 6.0, 3.0],
            ["grid 2x1x1", "OutOfResources: shared memory"]]
    for name, timings in (("attn_in-m8-abc", rows), ("norm-m8-def", None)):
        (tmp_path / name).mkdir()
        meta = {"meta": {"timings": timings} if timings else {}}
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    [s] = cvm.summaries(tmp_path)
    assert (s["timed"], s["failed"], s["pick_us"], s["best_us"]) == (3, 1, 9.0, 3.0)
    assert s["best_layout"] == "grid 8x1x1" and s["rho"] == pytest.approx(-0.5)
    cvm.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| attn_in-m8-abc | 3 | -0.50 | 9.0 | 3.0 | 3.00× | grid 8x1x1, w4s3p |" in out
    assert "1 entries: the cost model's pick within 10% of the fastest in 0" in out
    with pytest.raises(SystemExit, match="keeps profiler timings"):
        cvm.main([str(tmp_path), "--label", "mlp"])


def test_rescore_costs_the_timed_designs_with_the_current_cost_model(tmp_path):
    # an entry whose timings rows carry a stale cost column: --rescore searches the program again,
    # matches its candidates to the rows by layout and costs them now
    from mirage_serve.patching.programs import layer_programs
    from superopt.ir import digest, layout
    from superopt.search import superoptimize
    from superopt.search.cost import graph_cost

    [program] = [g for label, m, g in layer_programs("SmolLM2-135M", (1,), fused_residual=True)
                 if label == "attn_out"]
    designs = superoptimize(program).candidates()[:3]
    rows = [[layout(g), "w4s3", us, 99.0] for g, us in zip(designs, (3.0, 1.0, 2.0))]
    rows.append(["grid 9x9x9 t128 f1 [1]", "w4s3", 0.5, 0.1])  # a design the search no longer offers
    (tmp_path / "attn_out-m1-abc").mkdir()
    meta = {"meta": {"program_digest": digest(program), "timings": rows}}
    (tmp_path / "attn_out-m1-abc" / "meta.json").write_text(json.dumps(meta))

    costs = cvm.rescored(tmp_path, ["SmolLM2-135M"], buckets=(1,))
    assert costs[digest(program)][layout(designs[0])] == pytest.approx(graph_cost(designs[0]), abs=0.01)
    [s] = cvm.summaries(tmp_path, costs=costs)
    assert s["timed"] == 3 and s["best_us"] == 1.0  # the unmatched row is left out
    assert s["fastest_offered"] is False  # the 0.5 µs design is not offered any more
    pick = min(range(3), key=lambda i: graph_cost(designs[i]))
    assert s["pick_us"] == (3.0, 1.0, 2.0)[pick]


def test_held_out_summary_says_how_the_constants_rank_and_pick():
    from superopt.search.cost import DEFAULT_PARAMS

    def lib(nbytes):   # one library kernel reading nbytes: the estimate grows with the bytes
        return [dict(bytes=nbytes, reread_bytes=0.0, flops=0, blocks=132, sms=132, threads_busy=1.0, largest=1,
                     largest_padded=1, tile_bytes=0.0, resident=1.0, library=True)]
    same = [(lib(1e6), 1.0), (lib(2e6), 2.0), (lib(3e6), 3.0)]       # the GPU agrees with the model
    reversed_ = [(lib(1e6), 3.0), (lib(2e6), 2.0), (lib(3e6), 1.0)]  # the model's pick is the slowest: 3x
    out = cvm.held_out_summary([same, reversed_], DEFAULT_PARAMS)
    assert out == ("rank correlation mean +0.000, median +0.000; the pick within 10% of the fastest in 1 of 2, "
                   "pick / fastest geomean 1.732")
