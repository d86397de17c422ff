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


def test_profiles_refit_the_arch_constants_and_patch_reads_them(tmp_path):
    cache = KernelCache(tmp_path, shipped_dir=False, read_only=False)
    assert cost_fit.params(cache, "sm_90") is None
    p = Program("gemv")
    x = p.input("x", (8, 4096), "bfloat16")
    w = p.input("w", (4096, 4096), "bfloat16")
    p.output(p.matmul(x, p.transpose(w)))
    cands = superoptimize(p.build(), SearchBudget(max_seconds=30)).candidates()
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
