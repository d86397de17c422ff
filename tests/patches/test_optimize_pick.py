"""optimize.choose with a profiler: the pick is what runs, and a cache hit brings back its launch."""
from __future__ import annotations

from mirage_serve import optimize
from mirage_serve.cache import CacheKey, KernelCache, versions_now
from superopt.codegen.launch import Launch
from superopt.ir import digest, to_text
from tests.fixtures.budget import states_budget
from tests.fixtures.programs import down_proj


def test_pick_is_stored_and_a_hit_skips_profiling(tmp_path):
    program = down_proj()
    cache = KernelCache(tmp_path)
    key = CacheKey(digest(program), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_out-m2")
    calls = []

    def pick(result):  # a stand-in profiler that prefers the last searched candidate offered
        cands = result.candidates()
        calls.append(len(cands))
        searched = [g for g in cands if g != program]
        return optimize.Pick(searched[-1], {"k0": Launch(2, 4)}, 3.5, f"fastest of {len(cands)}",
                             timings=(["grid 4x1x1 t128 f2 [2,304] [56,304]", "w2s4", 3.5, 4.1],))

    budget = states_budget()
    first = optimize.choose(program, budget=budget, arch="sm_90", cache=cache, key=key, pick=pick)
    assert first.source == "search" and calls and calls[0] > 3
    assert first.launch == {"k0": Launch(2, 4)} and first.profile == f"fastest of {calls[0]}"
    assert to_text(first.graph) == to_text([g for g in first.result.candidates() if g != program][-1])
    assert optimize.verify(program, first.graph).ok

    second = optimize.choose(program, budget=budget, arch="sm_90", cache=cache, key=key, pick=pick)
    assert second.source == "cache" and len(calls) == 1  # no search, no profiling
    assert to_text(second.graph) == to_text(first.graph)
    assert second.launch == {"k0": Launch(2, 4)} and second.profile == first.profile
    # every candidate's time stays with the entry, for comparing the cost model with the GPU later
    assert cache.get(key).meta["timings"] == [["grid 4x1x1 t128 f2 [2,304] [56,304]", "w2s4", 3.5, 4.1]]
    # verified once, when stored: a hit carries that verdict instead of verifying again
    assert first.verification.ok and second.verification.ok
    assert second.verification.verdict.startswith("verified when cached: equivalent")
    assert second.verification.seconds == 0.0


def test_a_reinstantiation_left_with_only_the_program_searches_afresh():
    program = down_proj()

    class Seed:  # another bucket's result whose structures fit nothing at this shape
        def reinstantiate(self, p):
            return type("R", (), {"best": p, "ranked": [(p, 1.0)]})()

    choice = optimize.choose(program, budget=states_budget(), arch="sm_90", seed=Seed())
    assert choice.source == "search" and choice.graph != program


def test_research_offers_the_shipped_graph_to_the_profiler_and_stores_the_winner(tmp_path):
    # PatchOptions.research: a shipped program is searched again; its μGraph is the first candidate timed
    program = down_proj()
    key = CacheKey(digest(program), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_out-m2")
    budget = states_budget()
    offered = []

    def pick_at(index):
        def pick(result):
            cands = result.candidates()
            offered.append(cands)
            g = [c for c in cands if c != program][index]
            return optimize.Pick(g, {"k0": Launch(4, 3)}, 2.0 + len(offered), f"pick {len(offered)}")
        return pick

    maker = KernelCache(tmp_path / "maker", shipped_dir=False)
    first = optimize.choose(program, budget=budget, arch="sm_90", cache=maker, key=key, pick=pick_at(-1))
    assert maker.export_shipped(tmp_path / "shipped") == 1

    def fresh():  # an empty user cache over the shipped one
        import shutil
        shutil.rmtree(tmp_path / "user", ignore_errors=True)
        return KernelCache(tmp_path / "user", shipped_dir=tmp_path / "shipped")

    # without research, or without a profiler to decide, the shipped entry is simply used
    assert optimize.choose(program, budget=budget, arch="sm_90", cache=fresh(), key=key,
                           pick=pick_at(0)).source == "cache" and len(offered) == 1
    assert optimize.choose(program, budget=budget, arch="sm_90", cache=fresh(), key=key,
                           research=True).source == "cache"

    cache = fresh()
    kept = optimize.choose(program, budget=budget, arch="sm_90", cache=cache, key=key, pick=pick_at(0),
                           research=True)
    assert kept.source == "search" and offered[1][0] == first.graph  # the shipped μGraph competes first
    assert offered[1].count(first.graph) == 1 and kept.graph == first.graph
    assert cache.get(key).origin == "user" and cache.get(key).meta["profile"] == "pick 2"
    # the user entry is this search's own result: researching again hits it
    assert optimize.choose(program, budget=budget, arch="sm_90", cache=cache, key=key, pick=pick_at(0),
                           research=True).source == "cache" and len(offered) == 2

    cache = fresh()
    replaced = optimize.choose(program, budget=budget, arch="sm_90", cache=cache, key=key, pick=pick_at(1),
                               research=True)
    assert replaced.graph != first.graph
    entry = cache.get(key)
    assert entry.ugraph_text == to_text(replaced.graph) and entry.meta["median_us"] == 5.0


def test_profile_timings_name_each_candidate_its_launch_time_and_cost():
    # what a cache entry keeps of the profiling: one row per candidate, errors with their reason
    from superopt.ir import layout
    from superopt.runtime.profile import ProfileResult
    from tests.fixtures.ugraphs import FIXTURES

    a, b = FIXTURES["gated_mlp"]().ugraph, FIXTURES["llama_qkv"]().ugraph
    rows = optimize.profile_timings([ProfileResult(0, a, {"k0": Launch(2, 3, prefetch=True)}, 12.345),
                                     ProfileResult(1, b, error="OutOfResources: shared memory")])
    assert rows[0][:3] == [layout(a), "w2s3p", 12.35] and rows[0][3] > 0
    assert rows[1] == [layout(b), "OutOfResources: shared memory"]
    assert layout(a) == "grid 1x4x1 t128 f3 [8,32] [32,20] [32,20]"
    assert layout(FIXTURES["gated_mlp"]().program) == "matmul; silu; matmul; mul"  # views left out


def test_research_replaces_the_shipped_graph_only_when_clearly_faster():
    from superopt.runtime.profile import ProfileResult
    from tests.fixtures.ugraphs import FIXTURES

    shipped, new, broken = (FIXTURES[n]().ugraph for n in ("gated_mlp", "llama_qkv", "rmsnorm_matmul"))

    def ranked(new_us, shipped_us):  # as the profiler returns them: fastest first, errors last
        rows = sorted([ProfileResult(0, new, median_us=new_us), ProfileResult(1, shipped, median_us=shipped_us)],
                      key=lambda r: r.median_us)
        return rows + [ProfileResult(2, broken, error="OutOfResources")]

    assert optimize.incumbent_first(ranked(9.8, 10.0), shipped)[0].ugraph is shipped    # 2% is noise
    assert optimize.incumbent_first(ranked(9.4, 10.0), shipped)[0].ugraph is new        # 6% is not
    assert optimize.incumbent_first(ranked(11.0, 10.0), shipped)[0].ugraph is shipped
    assert [r.ugraph for r in optimize.incumbent_first(ranked(9.8, 10.0), shipped)] == [shipped, new, broken]
    # a shipped graph that failed to run cannot be kept
    failed = [ProfileResult(0, new, median_us=9.9), ProfileResult(1, shipped, error="OutOfResources")]
    assert optimize.incumbent_first(failed, shipped)[0].ugraph is new


def _ship_program(tmp_path, program, key, meta: dict):
    """A shipped cache holding ``program`` itself as the design, with ``meta`` (an older search's record)."""
    from mirage_serve.cache import CacheEntry

    maker = KernelCache(tmp_path / "maker", shipped_dir=False)
    maker.put(key, CacheEntry(to_text(program), {}, {}, {"program_digest": digest(program), "source": "search",
                                                          "verified": True, **meta}))
    assert maker.export_shipped(tmp_path / "shipped") == 1
    return KernelCache(tmp_path / "user", shipped_dir=tmp_path / "shipped")


def _fused_pick(program, offered: list):
    """A stand-in profiler that records the candidates it is offered and picks the first fused one (15 µs)."""
    def pick(result):
        cands = result.candidates()
        offered.append(cands)
        fused = next(c for c in cands if c != program)
        return optimize.Pick(fused, {"k0": Launch(4, 3)}, 15.0, f"fastest of {len(cands)} timed")
    return pick


def _user_program(tmp_path, **meta):
    """(program, key, a user cache holding the program itself as the design, with ``meta``)."""
    from mirage_serve.cache import CacheEntry

    program = down_proj()
    key = CacheKey(digest(program), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_in-m2")
    cache = KernelCache(tmp_path / "user", shipped_dir=False)
    cache.put(key, CacheEntry(to_text(program), {}, {}, {"program_digest": digest(program), "source": "search",
                                                          "verified": True, **meta}))
    return program, key, cache


def test_a_shipped_unfused_program_is_searched_again_and_the_fused_winner_stored(tmp_path):
    # an older search found nothing to beat the program (Gemma's gelu_tanh gate/up): the current one
    # runs, the shipped program competes as the incumbent, and what wins goes to the user cache
    program = down_proj()
    key = CacheKey(digest(program), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_in-m2")
    cache = _ship_program(tmp_path, program, key, {"profile": "fastest of 1 timed: 52.1 µs (cost model's pick 52.1 µs)"})
    offered = []
    pick = _fused_pick(program, offered)

    choice = optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key, pick=pick)
    assert choice.source == "search" and choice.graph != program and offered[0][0] == program
    entry = cache.get(key)
    assert entry.origin == "user" and entry.ugraph_text == to_text(choice.graph)
    # the user entry is this search's own: believed from now on
    assert optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key,
                           pick=pick).source == "cache" and len(offered) == 1


def test_a_user_entry_holding_the_program_untimed_is_searched_again_where_a_profiler_can_decide(tmp_path):
    # written where no profiler ran: the program, with no GPU time; a patch with the profiler searches
    # once more (the entry the incumbent), stores the timed winner, and believes that from then on
    program, key, cache = _user_program(tmp_path)
    # without a profiler nothing can say more than the entry does: it is used
    assert optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key).source == "cache"
    offered = []
    pick = _fused_pick(program, offered)

    choice = optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key, pick=pick)
    assert choice.source == "search" and choice.graph != program and offered[0][0] == program
    assert cache.get(key).ugraph_text == to_text(choice.graph) and cache.get(key).meta["median_us"] == 15.0
    assert optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key,
                           pick=pick).source == "cache" and len(offered) == 1


def test_a_user_entry_holding_the_program_that_won_on_the_gpu_is_believed(tmp_path):
    program, key, cache = _user_program(tmp_path, median_us=9.0)
    offered = []
    choice = optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key,
                             pick=lambda r: offered.append(r))
    assert choice.source == "cache" and choice.graph == program and not offered


def test_an_unproven_program_whose_search_fails_is_searched_once_not_on_every_patch(tmp_path, monkeypatch):
    import superopt.search

    program, key, cache = _user_program(tmp_path)
    searches = []

    def failing(p, **kw):
        searches.append(p)
        raise RuntimeError("no design")

    monkeypatch.setattr(superopt.search, "superoptimize", failing)
    pick = lambda r: None  # noqa: E731 (never reached: the search fails first)
    # search_budget=0 tries nothing, so it proves nothing: the entry stays unproven
    assert optimize.choose(program, budget=0, arch="sm_90", cache=cache, key=key, pick=pick).source == "cache"
    assert "unbeaten" not in cache.get(key).meta
    for _ in range(2):
        choice = optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key, pick=pick)
        assert choice.source == "cache" and choice.graph == program
    assert len(searches) == 1 and "search failed: RuntimeError: no design" in cache.get(key).meta["unbeaten"]
