"""Generated Triton kernels on the GPU: bf16/fp16 correctness, poisoned outputs, CUDA-graph replay,
re-tiled variants, and the custom ops under torch.compile (all marked ``gpu``)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from superopt.codegen.launch import Launch
from superopt.interp import NumpyDomain, evaluate
from tests.superopt.codegen.triton_cases import CASES, CHAIN_CASES, SUMMED_CASES, build

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
TOL = {"bfloat16": 1e-2, "float16": 2e-3}  # docs/conventions.md tolerance table
DT = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _inputs(fx, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(v.type.shape, generator=g).to(DT[dtype]).cuda() for v in fx.program.inputs]


def _errors(fx, xs, outs):
    ref = evaluate(fx.program, [x.double().cpu().numpy() for x in xs], NumpyDomain())
    return [float(np.linalg.norm(o.double().cpu().numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, ref)]


def _poisoned(fx, dtype, launch=None):
    from superopt.runtime import compile_graph

    cg = compile_graph(fx.ugraph, device="cuda", launch=launch)
    for buf in cg.pool.values():
        if buf.dim():
            buf.fill_(float("nan"))
    return cg


def _replayed_errors(fx, cg, dtype, seeds):
    """(seed, float64 errors) of ``cg`` captured once in a CUDA graph, replayed on fresh inputs per seed."""
    xs = _inputs(fx, dtype, seeds[0] - 1)
    cg(*xs)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = cg(*xs)
    for seed in seeds:
        for x, n in zip(xs, _inputs(fx, dtype, seed)):
            x.copy_(n)
        graph.replay()
        yield seed, _errors(fx, xs, [o.clone() for o in outs])


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_kernel_matches_float64(case, dtype):
    fx = build(case, dtype)
    cg = _poisoned(fx, dtype)
    for seed in (1, 2):  # fresh inputs each time: a stale or racy result cannot pass twice
        xs = _inputs(fx, dtype, seed)
        errs = _errors(fx, xs, cg(*xs))
        assert all(np.isfinite(errs)) and max(errs) <= TOL[dtype], f"{case} {dtype} seed {seed}: {errs}"


@pytest.mark.parametrize("case", ["llama_qkv", "decode_attention", "gqa", "lora"])
def test_cuda_graph_replay_equals_eager(case):
    fx = build(case, "bfloat16")
    cg = _poisoned(fx, "bfloat16")
    xs = _inputs(fx, "bfloat16", 3)
    cg(*xs)  # warm-up: compiles the kernels outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = cg(*xs)
    for seed in (4, 5):
        new = _inputs(fx, "bfloat16", seed)
        for x, n in zip(xs, new):
            x.copy_(n)
        graph.replay()
        replayed = [o.clone() for o in outs]
        eager = cg(*xs)
        for r, e in zip(replayed, eager):
            assert torch.equal(r, e), f"{case}: replay differs from eager"
        assert max(_errors(fx, xs, replayed)) <= TOL["bfloat16"]


@pytest.mark.parametrize("case", ["found_kv_split_k", "two_way_sums"])
def test_cross_block_sums_stay_right_over_many_replays(case):
    # the last block of a tile stores the sum and zeroes the workspace and counter for the next
    # launch: a missed reset or a read before another block's add shows up as a wrong sum within a
    # few replays (atomics sum in any order, so replays are compared to float64, not to each other)
    fx = build(case, "bfloat16")
    for seed, errs in _replayed_errors(fx, _poisoned(fx, "bfloat16"), "bfloat16", range(8, 28)):
        assert all(np.isfinite(errs)) and max(errs) <= TOL["bfloat16"], f"{case} replay with seed {seed}: {errs}"


@pytest.mark.parametrize("case", SUMMED_CASES)
def test_ordered_cross_block_sums_give_the_same_bits_on_every_replay(case):
    # compile_graph(ordered_sums=True), as PatchOptions.deterministic builds: each block stores its part in a slot
    # of its own, the tile's last block adds the slots in order. Replays of one input are bitwise equal (atomic adds
    # are not: their order follows the blocks' timing); a slot read before its block stored it shows up as a wrong
    # or poisoned sum. (Split-KV attention is not among the cases: its partial outputs meet in a combine kernel,
    # in a fixed order already.)
    from superopt.runtime import compile_graph

    fx = build(case, "bfloat16")
    cg = compile_graph(fx.ugraph, device="cuda", ordered_sums=True)
    assert any(s.parts for _, s, _ in cg.kernels.values()) and "atomic_add(w" not in cg.module.source
    for ws in cg.workspace.values():
        ws.fill_(float("nan"))
    xs = _inputs(fx, "bfloat16", 7)
    first = [o.clone() for o in cg(*xs)]
    errs = _errors(fx, xs, first)
    assert all(np.isfinite(errs)) and max(errs) <= TOL["bfloat16"], f"{case}: {errs}"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = cg(*xs)
    for replay in range(50):
        graph.replay()
        assert all(torch.equal(o, f) for o, f in zip(outs, first)), f"{case}: replay {replay} differs"


def _llama_4k_attention_64_splits(dtype):
    from superopt.runtime.retile import split_kv_tilings
    from tests.fixtures.ugraphs import FIXTURES

    fx = FIXTURES["decode_attention"](batch=1, q_heads=32, kv_heads=8, head_dim=128, kv_len=4096, dtype=dtype)
    g = next(g for g in split_kv_tilings(fx.ugraph) if g.customized_nodes()[0].block.grid[2] == 64)
    return dataclasses.replace(fx, ugraph=g)


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("case", [*CHAIN_CASES, "llama_4k_64_splits"])
def test_chained_split_and_combine_stay_right_over_many_replays(case, dtype):
    # the split kernel runs the combine in the last block of each group (ir.chain): a counter not
    # reset, or a last block reading a partial another block has not yet made visible, shows up
    # as a wrong (or poisoned) output within a few replays on fresh inputs
    from superopt.codegen.triton import render_triton

    fx = _llama_4k_attention_64_splits(dtype) if case == "llama_4k_64_splits" else build(case, dtype)
    cg = _poisoned(fx, dtype, launch={k.name: Launch(4, 3, chain=True) for k in render_triton(fx.ugraph).kernels})
    assert cg.tails and len(cg.kernels) == 1
    for seed, errs in _replayed_errors(fx, cg, dtype, range(12, 24)):
        assert all(np.isfinite(errs)) and max(errs) <= TOL[dtype], f"{case} {dtype} replay {seed}: {errs}"


def test_out_argument_and_no_allocation_per_call():
    fx = build("rmsnorm_matmul_odd", "float16")
    from superopt.runtime import compile_graph

    cg = compile_graph(fx.ugraph, device="cuda")
    xs = _inputs(fx, "float16", 6)
    cg(*xs)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    dst = torch.full(fx.ugraph.output_types[0].shape, float("nan"), dtype=torch.float16, device="cuda")
    after_dst = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        (o,) = cg(*xs, out=[dst])
    assert o is dst
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == after_dst == before + 1
    assert max(_errors(fx, xs, [dst])) <= TOL["float16"]


def test_retiled_variants_match():
    from superopt.runtime import compile_graph
    from superopt.runtime.retile import dense_tilings
    from tests.fixtures.ugraphs import FIXTURES

    fx = FIXTURES["rmsnorm_gated_mlp"](rows=3, hidden=512, inter=1024, dtype="bfloat16")
    variants = dense_tilings(fx.ugraph, sms=16)
    assert variants
    xs = _inputs(fx, "bfloat16", 7)
    for g in variants:
        assert max(_errors(fx, xs, compile_graph(g)(*xs))) <= TOL["bfloat16"]


def test_custom_ops_under_torch_compile():
    from superopt.runtime import compile_graph

    fx = build("matmul_residual", "bfloat16")
    cg = compile_graph(fx.ugraph, device="cuda")
    xs = _inputs(fx, "bfloat16", 8)
    want = cg(*xs)[0].clone()
    f = torch.compile(lambda *a: cg(*a)[0] * 2.0)
    assert torch.equal(f(*xs), want * 2.0)


def test_selector_times_search_candidates_and_its_winner_is_correct():
    """The profiler's pick among a real search's candidates computes the program (bf16 tolerance)."""
    from superopt.lax import Program
    from superopt.runtime import compile_graph
    from superopt.runtime.select import Selector
    from superopt.search import superoptimize
    from tests.fixtures.budget import states_budget

    p = Program("down_proj")
    x = p.input("x", (3, 1216), "bfloat16")
    w = p.input("w", (448, 1216), "bfloat16")
    p.output(p.matmul(x, p.transpose(w)))
    program = p.build()
    result = superoptimize(program, states_budget())
    cands = result.candidates()
    assert len(cands) > len(result.ranked[:3])  # designs at other extents are offered too
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(3, 1216, generator=g).cuda().bfloat16(), torch.randn(448, 1216, generator=g).cuda().bfloat16()]
    with Selector(torch.device("cuda"), workers=2) as sel:
        ranked = sel.pick(cands, xs)
    assert ranked[0].error is None and ranked[0].median_us == min(r.median_us for r in ranked)
    want = xs[0].double() @ xs[1].double().T
    got = compile_graph(ranked[0].ugraph, launch=ranked[0].launch)(*xs)[0].double()
    assert ((got - want).norm() / want.norm()).item() <= TOL["bfloat16"]


def test_kernels_wait_for_their_predecessor_on_sm90():
    """On sm_90+ every kernel is rendered with programmatic dependent launch's wait and signal
    (superopt.runtime.grid_dependency), and without them when the caller turns it off."""
    from superopt.codegen.triton import PDL_WAIT
    from superopt.runtime import compile_graph

    g = build("llama_qkv", "bfloat16").ugraph
    cg, off = compile_graph(g, device="cuda"), compile_graph(g, device="cuda", pdl=False)
    major, minor = torch.cuda.get_device_capability()
    if 10 * major + minor < 90:
        pytest.skip("programmatic dependent launch needs sm_90+")
    assert cg.pdl and cg.module.pdl and cg.source.count(PDL_WAIT) == len(cg.module.kernels)
    assert not off.pdl and PDL_WAIT not in off.source


def _replays_as_plain(pdl, plain, chain, buffers, fresh, seeds) -> list:
    """``chain(graphs, *buffers)`` captured once in a CUDA graph over the ``pdl`` compiled graphs, then replayed
    after ``fresh(seed)`` is copied into ``buffers``: asserts each replay's bits equal the chain over ``plain``
    launched on the same inputs, and returns those plain outputs."""
    chain(pdl, *buffers)  # compiles outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(pdl, *buffers)
    wants = []
    for seed in seeds:
        for dst, src in zip(buffers, fresh(seed)):
            dst.copy_(src)
        graph.replay()
        wants.append(chain(plain, *buffers).clone())
        assert torch.equal(out, wants[-1]), f"seed {seed}: replay with PDL differs"
    return wants


def test_a_dependent_chain_replays_bitwise_as_without_pdl():
    """Twelve launches where each reads the one before it's output and overwrites what the one
    before that read, captured in a CUDA graph with programmatic dependent launch: a kernel that
    started work before its predecessor completed would read a stale or half-written input."""
    from superopt.runtime import compile_graph

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    fx = build("gqa", "bfloat16")  # attention [2,16,64] -> [2,16,64], two kernels

    def chain(graphs, x, *kv):
        for i in range(12):
            x = graphs[i % 2](x, *kv)[0]
        return x

    plain = [compile_graph(fx.ugraph, device="cuda", pdl=False) for _ in range(2)]
    pdl = [compile_graph(fx.ugraph, device="cuda") for _ in range(2)]
    _replays_as_plain(pdl, plain, chain, _inputs(fx, "bfloat16", 6), lambda seed: _inputs(fx, "bfloat16", seed),
                      (7, 8, 9))


def test_kernels_that_ask_l2_for_their_weights_replay_bitwise_as_without_pdl():
    """A GEMV whose 2 MB weight its 64 blocks ask L2 for before their wait (``_weights_to_l2``), chained twelve
    times (each launch reads the one before it's output) in a CUDA graph: the same bits as plain launches."""
    from superopt.ir.text import from_text
    from superopt.runtime import compile_graph
    from tests.superopt.codegen.test_grid_dependency import GEMV

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    g = from_text(GEMV.format(rows=1024, cols=1024, grid=64, loop=4, tr=16, tc=256))
    plain = [compile_graph(g, device="cuda", pdl=False) for _ in range(2)]
    pdl = [compile_graph(g, device="cuda") for _ in range(2)]
    assert "prefetch.global.L2" in pdl[0].source and "prefetch.global.L2" not in plain[0].source

    def chain(graphs, w, x):
        for i in range(12):
            x = graphs[i % 2](w, x)[0]
        return x

    def fresh(seed):  # the weight scaled so twelve products stay finite in bf16
        gen = torch.Generator().manual_seed(seed)
        return [(torch.randn(1024, 1024, generator=gen) / 32).to(torch.bfloat16).cuda(),
                torch.randn(8, 1024, generator=gen).to(torch.bfloat16).cuda()]

    wants = _replays_as_plain(pdl, plain, chain, fresh(11), fresh, (12, 13, 14))
    assert all(torch.isfinite(want).all() for want in wants)
