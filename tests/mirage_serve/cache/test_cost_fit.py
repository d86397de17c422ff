"""patch()'s profiler timings refit the cost model per arch in the cache (``mirage_serve.cost_fit``)."""
from __future__ import annotations

from dataclasses import dataclass

from mirage_serve import cost_fit
from mirage_serve.cache import KernelCache
from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize
from superopt.search.cost import CostParams, graph_cost


@dataclass
class _Timed:  # the fields of superopt.runtime.profile.ProfileResult that record reads
    ugraph: object
    median_us: float
    error: str | None = None


def _gemv_candidates():
    p = Program("gemv")
    x = p.input("x", (8, 4096), "bfloat16")
    w = p.input("w", (4096, 4096), "bfloat16")
    p.output(p.matmul(x, p.transpose(w)))
    return superoptimize(p.build(), SearchBudget(max_seconds=30)).candidates()


def test_profiles_refit_the_arch_constants_and_patch_reads_them(tmp_path):
    cache = KernelCache(tmp_path, shipped_dir=False, read_only=False)
    assert cost_fit.params(cache, "sm_90") is None
    cands = _gemv_candidates()
    gpu = CostParams(sm_share=3.0, tile_elems=16384)  # what the "GPU" measures follows
    ranked = [_Timed(g, graph_cost(g, params=gpu)) for g in cands] + [_Timed(cands[0], float("inf"), "smem")]
    cost_fit.record(cache, "sm_90", ranked)
    fitted = cost_fit.params(cache, "sm_90")
    assert fitted is not None and fitted != CostParams()
    assert cost_fit.params(cache, "sm_80") is None
    (tmp_path / cost_fit.FILE).write_text("{not json")  # a broken file: ignored, then rewritten
    assert cost_fit.params(cache, "sm_90") is None
    cost_fit.record(cache, "sm_90", ranked)
    assert cost_fit.params(cache, "sm_90") == fitted
    read_only = KernelCache(tmp_path / "ro", shipped_dir=False, read_only=True)
    cost_fit.record(read_only, "sm_90", ranked)
    assert not (tmp_path / "ro" / cost_fit.FILE).exists()


def test_a_user_with_no_profiles_searches_with_the_shipped_fit_and_refits_from_its_rows(tmp_path):
    from superopt.search.cost import load_params
    from superopt.search.fit import graph_features, kept_rows, save_fit

    cands = _gemv_candidates()
    shipped_gpu = CostParams(sm_share=3.0, tile_elems=16384)
    shipped_row = [(graph_features(g), graph_cost(g, params=shipped_gpu)) for g in cands]
    shipped_params = CostParams(launch_us=11.0, reread=0.9)
    (tmp_path / "shipped").mkdir()
    (tmp_path / "user").mkdir()
    save_fit(tmp_path / "shipped" / cost_fit.FILE, "sm_90", shipped_params, [shipped_row], 0.1, 0.9, keep_rows=8)
    cache = KernelCache(tmp_path / "user", shipped_dir=tmp_path / "shipped", read_only=False)
    assert cost_fit.params(cache, "sm_90") == shipped_params      # nothing profiled here yet
    assert cost_fit.params(cache, "sm_80") is None

    user_gpu = CostParams(inflight_bytes=32768)
    cost_fit.record(cache, "sm_90", [_Timed(g, graph_cost(g, params=user_gpu)) for g in cands])
    assert cost_fit.params(cache, "sm_90") == load_params(tmp_path / "user" / cost_fit.FILE, "sm_90")  # the user's
    kept = kept_rows(tmp_path / "user" / cost_fit.FILE, "sm_90")
    assert len(kept) == 2 and [us for _, us in kept[0]] == [us for _, us in shipped_row]  # refit with the shipped row


def test_the_shipped_fit_holds_sm_90_constants_and_rows_they_order_better_than_the_hand_set_ones():
    # kernels_cache/cost_fit.json: `benchmarks/cost_vs_measured.py kernels_cache --fit ... --keep 32`
    from mirage_serve.cache import shipped_cache_dir
    from superopt.search.cost import DEFAULT_PARAMS, load_params
    from superopt.search.fit import kept_rows, score

    path = shipped_cache_dir() / cost_fit.FILE
    fitted, rows = load_params(path, "sm_90"), kept_rows(path, "sm_90")
    assert fitted is not None and fitted.launch_us == DEFAULT_PARAMS.launch_us   # not fitted: superopt.search.fit
    assert len(rows) >= 16 and all(len(r) >= 3 for r in rows)
    assert score(rows, fitted) > score(rows, DEFAULT_PARAMS)
