"""Runtime pieces that need no kernel: library ops into preallocated buffers, re-tiling, launch plumbing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from superopt.interp import NumpyDomain, evaluate
from superopt.codegen.launch import Launch
from superopt.codegen.triton import render_triton
from superopt.runtime import compile_graph
from superopt.runtime.compiled import CompiledGraph
from superopt.runtime.retile import dense_tilings, retile, split_kv_tilings
from tests.superopt.codegen.triton_cases import build as build_case
from tests.fixtures.ugraphs import FIXTURES, random_inputs


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_lax_program_runs_as_library_ops_into_the_pool(name):
    # a Lax program is all library ops: every one writes into a preallocated buffer or is a view
    fx = FIXTURES[name]()
    xs = random_inputs(fx, np.random.default_rng(1))
    cg = compile_graph(fx.program, device="cpu")
    for buf in cg.pool.values():
        if buf.dim():
            buf.fill_(float("nan"))
    outs = cg(*[torch.from_numpy(x).float() for x in xs])
    ref = evaluate(fx.program, xs, NumpyDomain())
    for o, r in zip(outs, ref):
        assert np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r) <= 1e-5
    again = cg(*[torch.from_numpy(x).float() for x in xs])
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(outs, again))  # same pool, no new buffers


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("given", ["first", "last", "all"])
def test_bound_call_gives_the_plain_calls_outputs(name, given):
    # bind() fixes some inputs once (a site's weights) and plans the rest; same values as a call
    fx = FIXTURES[name]()
    xs = [torch.from_numpy(x).float() for x in random_inputs(fx, np.random.default_rng(4))]
    cg = compile_graph(fx.program, device="cpu")
    want = [o.clone() for o in cg(*xs)]
    per_call = {"first": [0], "last": [len(xs) - 1], "all": range(len(xs))}[given]
    call = cg.bind([None if i in per_call else x for i, x in enumerate(xs)])
    for buf in cg.pool.values():
        if buf.dim():
            buf.fill_(float("nan"))
    got = call(*[xs[i] for i in per_call])
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    fresh = [torch.randn_like(xs[i]) for i in per_call]  # a second call reads the new inputs
    merged = list(xs)
    for i, x in zip(per_call, fresh):
        merged[i] = x
    again = [o.clone() for o in call(*fresh)]
    assert all(torch.equal(g, w) for g, w in zip(again, cg(*merged)))


def _cache_write_case(batch=2, kv_len=9):
    from superopt.lax.attention import decode_layer_attention_program
    prog = decode_layer_attention_program(batch, 4, 2, 8, kv_len, dtype="float32")
    g = torch.Generator().manual_seed(3)
    xs = {v.name: torch.randn(v.type.shape, generator=g) for v in prog.inputs if v.name != "pos"}
    xs["pos"] = torch.tensor([kv_len - 3])
    xs["mask"] = torch.zeros(batch, 1, 1, kv_len)
    return prog, [xs[v.name] for v in prog.inputs]


@pytest.mark.parametrize("bound", [False, True])
def test_in_place_inputs_take_the_cache_write_without_a_copy(bound):
    # a decode step's KV-cache write updates the caller's cache itself: same values as the functional
    # graph, the cache outputs are the inputs, and the pool holds no cache-sized buffer for them
    prog, xs = _cache_write_case()
    names = [v.name for v in prog.inputs]
    want = [o.clone() for o in compile_graph(prog, device="cpu")(*[x.clone() for x in xs])]
    cg = compile_graph(prog, device="cpu", in_place=("k_cache", "v_cache"))
    caches = [xs[names.index(n)] for n in ("k_cache", "v_cache")]
    got = cg.bind([None] * len(xs))(*xs) if bound else cg(*xs)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert got[1] is caches[0] and got[2] is caches[1]
    assert all(torch.equal(c, w) for c, w in zip(caches, want[1:]))  # the inputs hold the written slot
    assert not any(buf.shape == caches[0].shape for buf in cg.pool.values())


@pytest.mark.parametrize("bound", [False, True])
def test_a_graph_no_kernel_can_count_for_counts_its_calls_after_its_work(bound):
    # library ops only (the program itself): the counter, here the position itself as a decode step hands it in,
    # is advanced after the cache writes read it: one more launch (``codegen.counted``)
    prog, xs = _cache_write_case()
    names = [v.name for v in prog.inputs]
    want = [o.clone() for o in compile_graph(prog, device="cpu")(*[x.clone() for x in xs])]
    cg = compile_graph(prog, device="cpu", in_place=("k_cache", "v_cache"), counter="pos")
    assert cg.counting is None
    assert cg.launches == compile_graph(prog, device="cpu", in_place=("k_cache", "v_cache")).launches + 1
    pos = xs[names.index("pos")]
    was = int(pos)
    got = cg.bind([None] * len(xs))(*xs, pos) if bound else cg(*xs, count=pos)
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and int(pos) == was + 1


def test_the_call_counter_is_taken_exactly_by_a_graph_built_for_one():
    prog, xs = _cache_write_case()
    with pytest.raises(TypeError, match="counter='pos', so a call takes the counter as count="):
        compile_graph(prog, device="cpu", counter="pos")(*xs)
    with pytest.raises(TypeError, match="counter=None, so a call takes no count="):
        compile_graph(prog, device="cpu")(*xs, count=torch.zeros(1, dtype=torch.int64))


def test_in_place_is_refused_for_an_input_with_another_reader():
    prog, _ = _cache_write_case()
    with pytest.raises(ValueError, match="q.*one reader"):
        compile_graph(prog, device="cpu", in_place=("q",))
    with pytest.raises(ValueError, match="not inputs"):
        compile_graph(prog, device="cpu", in_place=("k_all",))


def test_bind_checks_the_fixed_inputs():
    fx = FIXTURES["lora"]()
    cg = compile_graph(fx.program, device="cpu")
    good = [torch.randn(v.type.shape) for v in fx.program.inputs]
    with pytest.raises(ValueError, match="expected float32"):
        cg.bind([None, good[1].double(), *good[2:]])


def test_out_argument_receives_library_outputs():
    fx = FIXTURES["ntrans"]()
    xs = [torch.from_numpy(x).float() for x in random_inputs(fx, np.random.default_rng(2))]
    cg = compile_graph(fx.program, device="cpu")
    dst = torch.full(fx.program.output_types[0].shape, float("nan"))
    (o,) = cg(*xs, out=[dst])
    assert o is dst and torch.isfinite(dst).all()
    torch.testing.assert_close(dst, compile_graph(fx.program, device="cpu")(*xs)[0])


def test_inputs_are_checked():
    fx = FIXTURES["lora"]()
    cg = compile_graph(fx.program, device="cpu")
    good = [torch.randn(v.type.shape) for v in fx.program.inputs]
    with pytest.raises(ValueError, match="expected float32"):
        cg(good[0].double(), *good[1:])
    with pytest.raises(TypeError, match="expected 4 inputs"):
        cg(*good[:2])


def _same_function(a, b, fx, seed=3):
    xs = random_inputs(fx, np.random.default_rng(seed))
    ya, yb = evaluate(a, xs, NumpyDomain()), evaluate(b, xs, NumpyDomain())
    return all(np.allclose(p, q, rtol=1e-10, atol=1e-10) for p, q in zip(ya, yb))


@pytest.mark.parametrize("name, split_k", [("rmsnorm_matmul", 1), ("llama_qkv", 1), ("rmsnorm_gated_mlp", 1),
                                           ("lora", 1), ("matmul_residual", 1), ("rmsnorm_matmul", 2),
                                           ("llama_qkv", 4)])
def test_dense_retilings_keep_the_function(name, split_k):
    kw = {"inter": 256} if "mlp" in name else {"out": 384}
    fx = FIXTURES[name](hidden=1024, **kw, **({"split_k": split_k} if split_k > 1 else {}))
    variants = dense_tilings(fx.ugraph, n_tiles=(32, 64, 128), k_tiles=(128, 256), sms=4, keep=3)
    assert len(variants) >= 3
    blocks = {(v.customized_nodes()[0].block.grid, v.customized_nodes()[0].block.forloop) for v in variants}
    assert len(blocks) == len(variants)
    for (grid, forloop) in blocks:  # the K parts kept, the loop walking each part in 128 or 256 rows
        assert grid[2] == split_k and 1024 // split_k // forloop in (128, 256)
    for v in variants:
        assert _same_function(fx.ugraph, v, fx)


@pytest.mark.parametrize("name", ["decode_attention", "gqa", "qknorm"])
def test_kv_split_retilings_keep_the_function(name):
    kw = dict(batch=3, q_heads=4, kv_heads=2, head_dim=16, kv_len=256) if name == "decode_attention" else \
        dict(batch=1, q_len=16, head_dim=16, kv_len=256)
    fx = FIXTURES[name](**kw)
    variants = split_kv_tilings(fx.ugraph, sms=8)
    assert variants
    for v in variants:
        assert v.output_types == fx.ugraph.output_types
        assert _same_function(fx.ugraph, v, fx)


def test_retile_rejects_a_grid_that_does_not_divide():
    fx = FIXTURES["matmul_residual"]()
    with pytest.raises(Exception, match="divisible"):
        retile(fx.ugraph, 0, (1, 7, 1), 3)


def test_summed_workspaces_share_one_zeroed_buffer_and_stay_16_byte_aligned():
    # the found split-K μGraph sums three outputs ([1,1], [128,1], [128,1]) across its 112 blocks;
    # its buffers are laid out here without building its kernels (no Triton on this path)
    fx = build_case("found_kv_split_k", "float16")
    node = next(i for i, n in enumerate(fx.ugraph.nodes) if n.op == "customized")
    spec = next(s for s in render_triton(fx.ugraph).kernels if s.node_index == node)
    assert spec.workspaces == (0, 1, 2) and spec.counters == 1  # the three outputs share one tile count
    cg = CompiledGraph.__new__(CompiledGraph)
    cg.device, cg.workspace, cg.kernels = torch.device("cpu"), {}, {node: (None, spec, 4, 3)}
    cg.sums = {node: cg._summed(node, fx.ugraph.nodes[node])}
    ws = cg.finish_args(node)
    assert len(ws) == 4 and ws[-1].dtype == torch.int32 and not ws[-1].any()
    assert all(w.untyped_storage().data_ptr() == cg.sums[node].ws.untyped_storage().data_ptr() for w in ws[:3])
    assert all(w.data_ptr() % 16 == 0 and w.dtype == torch.float32 and not w.any() for w in ws[:3])
    assert [tuple(w.shape) for w in ws[:3]] == [v.type.shape for v in fx.ugraph.nodes[node].outs]


def test_selector_sweeps_a_candidate_that_is_slow_only_at_its_default_launch(monkeypatch):
    # The GPU case (ninth session): Llama-3.1-8B q_proj at 8 rows, its best design 49.7 µs at the
    # renderer's default launch and 17.4 µs at 2 warps, fell out of the swept few when timed at the
    # default alone. Stand-in timings: four designs, the last fast only at 2 warps.
    from superopt.runtime import select
    from superopt.runtime.profile import ProfileResult

    graphs = [FIXTURES[n]().ugraph for n in sorted(FIXTURES)[:4]]
    at_default = [20.0, 21.0, 22.0, 50.0]
    def timed(g, config):
        i = graphs.index(g)
        if config is None:
            return at_default[i]
        return 17.0 if (i == 3 and config.num_warps == 2) else at_default[i] + 1.0

    def fake_profile(ugraphs, inputs, configs, **_):
        out = []
        for g in ugraphs:
            us, config = min(((timed(g, c), c) for c in configs), key=lambda t: t[0])
            out.append(ProfileResult(graphs.index(g), g, {"k": config}, us))
        return sorted(out, key=lambda r: r.median_us)

    monkeypatch.setattr(select, "profile_candidates", fake_profile)
    monkeypatch.setattr(select, "fits", lambda g, c: True)
    ranked = select.Selector(torch.device("cpu"), workers=1).pick(graphs, [])
    assert ranked[0].ugraph is graphs[3] and ranked[0].median_us == 17.0


def test_a_pick_says_where_its_time_went(monkeypatch):
    # the block benchmark spent 269 s profiling 22 candidates (session 32) with no way to tell builds from
    # timing: each result carries the seconds both passes spent on it, and the selector each stage's
    from superopt.runtime import select
    from superopt.runtime.profile import ProfileResult

    graphs = [FIXTURES[n]().ugraph for n in sorted(FIXTURES)[:4]]
    spent = {None: 1.0}  # seconds a candidate costs at the probes (None among their configs), else at the sweep

    def fake_profile(ugraphs, inputs, configs, **_):
        took = spent[None] if None in configs else 0.25
        return [ProfileResult(i, g, {}, 10.0 + graphs.index(g), seconds=took) for i, g in enumerate(ugraphs)]

    monkeypatch.setattr(select, "profile_candidates", fake_profile)
    monkeypatch.setattr(select, "fits", lambda g, c: True)
    sel = select.Selector(torch.device("cpu"), workers=1)
    ranked = sel.pick(graphs, [])
    swept = set(map(id, graphs[:select.SWEEP_TOP]))
    assert [r.seconds for r in ranked] == [1.25 if id(r.ugraph) in swept else 1.0 for r in ranked]
    assert list(sel.stage_seconds) == ["probe builds", "probe timing", "sweep builds", "sweep timing"]
    assert all(v >= 0 for v in sel.stage_seconds.values())


def test_selector_sweeps_the_launches_of_a_graph_it_is_told_to(monkeypatch):
    # research mode's shipped μGraph: slow at every probe launch, fastest at one the sweep holds
    from superopt.runtime import select
    from superopt.runtime.profile import ProfileResult

    graphs = [FIXTURES[n]().ugraph for n in sorted(FIXTURES)[:5]]

    def fake_profile(ugraphs, inputs, configs, **_):
        out = []
        for g in ugraphs:
            i = graphs.index(g)
            us, config = min((((5.0 if (i == 4 and c == Launch(4, 4)) else 20.0 + i), c) for c in configs),
                             key=lambda t: t[0])
            out.append(ProfileResult(i, g, {"k": config}, us))
        return sorted(out, key=lambda r: r.median_us)

    monkeypatch.setattr(select, "profile_candidates", fake_profile)
    monkeypatch.setattr(select, "fits", lambda g, c: True)
    sel = select.Selector(torch.device("cpu"), workers=1)
    assert sel.pick(graphs, [])[0].ugraph is graphs[0]  # ranked 5th at the probes: never swept
    assert sel.pick(graphs, [], sweep_also=[graphs[4]])[0].ugraph is graphs[4]


def test_candidates_are_timed_as_they_will_run_and_the_launch_keeps_no_build_setting(monkeypatch):
    # Two build settings reach every candidate the profile times. in_place: a decode step's cache writes run in place
    # (a kernel stores them, codegen.store_through), or the profile times a copy of the whole cache per write.
    # ordered_sums (PatchOptions.deterministic): cross-block sums in a fixed order, so a split-K μGraph wins only if it
    # wins ordered. The ordering is the build's, not the launch's: the launch returned, which a cache stores, leaves
    # it out.
    from types import SimpleNamespace

    from superopt.codegen.launch import Launch
    from superopt.runtime import profile, select
    from superopt.runtime.profile import ProfileResult

    graphs = [FIXTURES[n]().ugraph for n in sorted(FIXTURES)[:2]]
    seen = []

    def fake_profile(ugraphs, inputs, configs, **kw):
        seen.append((kw.get("in_place"), kw.get("ordered_sums")))
        return [ProfileResult(i, g, {}, 1.0 + i) for i, g in enumerate(ugraphs)]

    monkeypatch.setattr(select, "profile_candidates", fake_profile)
    monkeypatch.setattr(select, "fits", lambda g, c: True)
    select.Selector(torch.device("cpu"), workers=1, in_place=("k_cache", "v_cache"), ordered_sums=True).pick(graphs, [])
    assert seen and all(s == (("k_cache", "v_cache"), True) for s in seen)

    built = []

    def fake_compile(g, **kw):
        built.append((kw.get("in_place"), kw.get("ordered_sums")))
        return SimpleNamespace(launch={"k0": Launch(2, 3, prefetch=True, ordered=True)})
    monkeypatch.setattr(profile, "compile_graph", fake_compile)
    monkeypatch.setattr(profile, "rotated_sets", lambda xs: [xs])
    monkeypatch.setattr(profile, "time_call", lambda *a, **kw: 5.0)
    (r,) = profile.profile_candidates(graphs[:1], [torch.zeros(1)], configs=(None,), in_place=("k_cache",),
                                      ordered_sums=True)
    assert built == [(("k_cache",), True)] and r.launch == {"k0": Launch(2, 3, prefetch=True)}


def test_a_job_that_kills_its_worker_is_found_and_the_others_still_run():
    # The H200 case (eleventh session): one candidate's Triton build hit an LLVM assertion, which
    # aborts the process; the broken pool failed every later build and the block benchmark lost
    # all its remaining rows. Here jobs 1 and 3 exit their process; the others return.
    import functools
    import multiprocessing as mp
    import operator
    import os
    from concurrent.futures import ProcessPoolExecutor

    from superopt.runtime.select import CRASHED, map_isolating_crashes

    def new_pool():
        return ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))

    die = functools.partial(os._exit, 3)
    jobs = [int, die, int, die, int]
    pool, failed = map_isolating_crashes(new_pool(), new_pool, operator.call, jobs)
    try:
        assert failed == {1: CRASHED, 3: CRASHED}
        assert pool.submit(operator.call, int).result() == 0  # the pool handed back works
    finally:
        pool.shutdown()


def test_a_job_that_never_ends_is_blamed_alone_and_the_pick_goes_on():
    # a build whose compiler loops or whose launch hangs the worker's stream: before, the parent waited forever
    import functools
    import multiprocessing as mp
    import operator
    import time
    from concurrent.futures import ProcessPoolExecutor

    from superopt.runtime.select import STUCK, map_isolating_crashes

    def new_pool():
        return ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))

    hang = functools.partial(time.sleep, 120)   # bounded: without the guard the test fails, not the suite
    jobs = [int, hang, int, int, int]
    t0 = time.perf_counter()
    pool, failed = map_isolating_crashes(new_pool(), new_pool, operator.call, jobs, stall_s=3.0)
    try:
        assert failed == {1: STUCK.format(3.0)}
        assert time.perf_counter() - t0 < 60
        assert pool.submit(operator.call, int).result() == 0
    finally:
        pool.shutdown()


def test_a_refused_launch_is_never_built_and_says_why(monkeypatch):
    from superopt.ir import to_text
    from superopt.runtime import profile

    g = FIXTURES[sorted(FIXTURES)[0]]().ugraph
    built = []
    from types import SimpleNamespace

    def compile_graph(*a, launch=None, **k):
        built.append(launch)
        return SimpleNamespace(launch=launch)

    monkeypatch.setattr(profile, "compile_graph", compile_graph)
    monkeypatch.setattr(profile, "time_call", lambda *a, **k: 1.0)
    monkeypatch.setattr(profile, "rotated_sets", lambda xs: [xs])
    refused = {profile.launch_key(to_text(g), None): "the build killed its worker process"}
    (r,) = profile.profile_candidates([g], [torch.zeros(1)], configs=[None], refused=refused)
    assert built == [] and r.error == "skipped default: the build killed its worker process"
    (r,) = profile.profile_candidates([g], [torch.zeros(1)], configs=[None, Launch(2, 3)], refused=refused)
    assert len(built) == 1 and r.error is None and r.tried[0][0] == Launch(2, 3)


def test_a_launch_that_breaks_the_context_stops_the_profile_and_is_named(monkeypatch):
    """After an illegal address every later launch fails too: the profiler stops at the launch that
    broke the context and names it with its μGraph (session 31: GQA b8 crashed in the parent with
    every candidate's error swallowed), while an ordinary failure only loses its candidate."""
    from types import SimpleNamespace

    from superopt.ir import to_text
    from superopt.runtime import profile

    g, h = (FIXTURES[n]().ugraph for n in sorted(FIXTURES)[:2])

    def time_call(cg, sets, **k):
        if Launch(4, 3) in cg.launch.values():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return 1.0
    monkeypatch.setattr(profile, "compile_graph", lambda *a, launch=None, **k: SimpleNamespace(launch=launch))
    monkeypatch.setattr(profile, "time_call", time_call)
    monkeypatch.setattr(profile, "rotated_sets", lambda xs: [xs])
    monkeypatch.setattr(profile, "context_alive", lambda device: True)
    (r, _) = profile.profile_candidates([g, h], [torch.zeros(1)], configs=[Launch(4, 3), Launch(2, 3)])
    assert r.error is None and [c for c, _ in r.tried] == [Launch(2, 3)]
    monkeypatch.setattr(profile, "context_alive", lambda device: False)
    with pytest.raises(profile.ContextLost, match="candidate 0 at launch w4s3 broke the CUDA context") as e:
        profile.profile_candidates([g, h], [torch.zeros(1)], configs=[Launch(2, 3), Launch(4, 3)])
    assert to_text(g) in str(e.value) and e.value.key == profile.launch_key(to_text(g), Launch(4, 3))


def test_a_build_workers_integer_inputs_are_valid_indices():
    # a cache write's position drawn from randn went negative: a device-side assert killed the worker
    from superopt.runtime.select import _example
    pos = _example((1,), torch.int64, "cpu")
    assert pos.dtype == torch.int64 and int(pos) == 0
    x = _example((64,), torch.bfloat16, "cpu")
    assert x.dtype == torch.bfloat16 and x.float().std() > 0.5


def test_a_launch_that_breaks_the_workers_context_ends_the_worker(monkeypatch):
    """A sticky CUDA error (an illegal address) in a build worker's one launch: the worker ends itself, so
    map_isolating_crashes blames that job and the parent never runs it in its own context; any other error
    is returned for the timing pass to report (the thirtieth session's GQA b8 crash)."""
    import os

    import torch

    from superopt.ir import to_text
    from superopt.runtime import select

    def launch_fails(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(select, "compile_graph", launch_fails)
    monkeypatch.setattr(select, "_example", lambda shape, dtype, device: torch.zeros(shape, dtype=dtype))
    exits = []

    def end_process(code):
        exits.append(code)
        raise SystemExit(code)
    monkeypatch.setattr(os, "_exit", end_process)
    job = (to_text(FIXTURES[sorted(FIXTURES)[0]]().ugraph), None, [((2, 3), "float32")], 0, False, (), False)

    monkeypatch.setattr(select, "context_alive", lambda device: True)
    assert select._build_once(job) == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert not exits
    monkeypatch.setattr(select, "context_alive", lambda device: False)
    with pytest.raises(SystemExit):
        select._build_once(job)
    assert exits == [select.BROKEN_CONTEXT_EXIT]


def test_build_worker_runs_the_launch_as_the_timing_pass_will(monkeypatch):
    """The worker's run is ``time_call``'s, over rotated input sets and in a CUDA graph: a single eager
    launch missed a fault that only the parent's chained, captured replays hit (session 31, GQA b8)."""
    import contextlib

    import torch

    from superopt.ir import to_text
    from superopt.runtime import select

    built, timed = object(), []
    monkeypatch.setattr(select, "compile_graph", lambda *a, **k: built)
    monkeypatch.setattr(select, "_example", lambda shape, dtype, device: torch.zeros(shape, dtype=dtype))
    monkeypatch.setattr(select, "rotated_sets", lambda xs: [xs, xs])
    monkeypatch.setattr(select, "time_call", lambda fn, sets, **kw: timed.append((fn, len(sets), kw)))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    job = (to_text(FIXTURES[sorted(FIXTURES)[0]]().ugraph), None, [((2, 3), "float32")], 0, False, (), False)
    assert select._build_once(job) is None
    assert timed == [(built, 2, dict(graph=True, reps=1, warmup=1))]


def test_a_launch_far_slower_than_the_fastest_so_far_is_timed_once(monkeypatch):
    from types import SimpleNamespace

    from superopt.runtime import profile

    g, h = (FIXTURES[n]().ugraph for n in sorted(FIXTURES)[:2])
    times = {Launch(2, 3): 10.0, Launch(4, 3): 50.0}
    limits = []

    def time_call(cg, sets, give_up_us=float("inf"), **k):
        limits.append(give_up_us)
        return times[next(iter(cg.launch.values()))]
    monkeypatch.setattr(profile, "compile_graph", lambda *a, launch=None, **k: SimpleNamespace(launch=launch))
    monkeypatch.setattr(profile, "time_call", time_call)
    monkeypatch.setattr(profile, "rotated_sets", lambda xs: [xs])
    ranked = profile.profile_candidates([g, h], [torch.zeros(1)], configs=[Launch(2, 3), Launch(4, 3)])
    assert limits == [float("inf"), 3 * 10.0, 3 * 10.0, 3 * 10.0]
    assert [r.median_us for r in ranked] == [10.0, 10.0]
