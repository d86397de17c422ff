"""Searched μGraphs with data movement on the GPU (marked ``gpu``): Phi-3-mini's fused qkv_proj +
split and gate_up_proj + chunk + silu·mul at the real shapes in bf16, one Triton kernel each,
match float64 and beat the unfused program; the movement cases replay in a CUDA graph."""
from __future__ import annotations

import numpy as np
import pytest

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.movement import random_indices
from superopt.search import SearchBudget, superoptimize
from tests.fixtures import movement as mv

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
TOL = {"bfloat16": 1e-2, "float16": 2e-3}  # CONVENTIONS.md tolerance table

PHI3 = [("qkv", lambda m, dt: mv.phi3_qkv(m=m, d=3072, heads=32, kv=32, hd=96, dtype=dt)),
        ("gate_up", lambda m, dt: mv.phi3_mlp(m=m, d=3072, inter=8192, dtype=dt))]


def _inputs(program, dtype, seed):
    rng = np.random.default_rng(seed)
    idx = random_indices(program, rng, NumpyDomain())
    return [torch.from_numpy(idx[v.name]).cuda() if v.name in idx else
            (torch.from_numpy(rng.standard_normal(v.type.shape)) * 0.5).to(getattr(torch, dtype)).cuda()
            for v in program.inputs]


def _errors(program, xs, outs):
    ref = evaluate(program, [x.cpu().numpy() if x.dtype == torch.int64 else x.double().cpu().numpy() for x in xs],
                   NumpyDomain())
    return [float(np.linalg.norm(o.double().cpu().numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, ref)]


def _median_us(fn, reps=200):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return float(np.median(times))


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("name, build", PHI3, ids=[p[0] for p in PHI3])
def test_phi3_fused_projection_on_gpu(name, build, rows, capsys):
    from superopt.runtime import compile_graph

    program = build(rows, "bfloat16")
    best = superoptimize(program, SearchBudget(max_seconds=120, workers=4)).best
    assert best.num_kernels == 1
    xs = _inputs(program, "bfloat16", 0)
    cg = compile_graph(best, device="cuda")
    for buf in cg.pool.values():
        if buf.dim() and buf.is_floating_point():
            buf.fill_(float("nan"))
    outs = [o.clone() for o in cg(*xs)]
    assert max(_errors(program, xs, outs)) <= TOL["bfloat16"]
    unfused = compile_graph(program, device="cuda")
    t_fused, t_unfused = _median_us(lambda: cg(*xs)), _median_us(lambda: unfused(*xs))
    with capsys.disabled():
        print(f"\nPhi-3-mini {name} b{rows}: fused {t_fused:.1f} us, unfused {t_unfused:.1f} us "
              f"({program.num_kernels} launches)")


def _rope_hd96(dtype):  # Phi-3's head dim: halves of 48 in register tiles of 64, gathered into place
    return mv.rope(heads=32, hd=96, table=64, dtype=dtype)


@pytest.mark.parametrize("build", [mv.phi3_qkv, mv.phi3_mlp, mv.gqa_scale, mv.rope, _rope_hd96])
def test_movement_case_replays_in_a_cuda_graph(build):
    from superopt.runtime import compile_graph

    program = build(dtype="float16")
    cg = compile_graph(superoptimize(program).best, device="cuda")
    xs = _inputs(program, "float16", 1)
    cg(*xs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = cg(*xs)
    for seed in (2, 3):
        for x, n in zip(xs, _inputs(program, "float16", seed)):
            x.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        assert max(_errors(program, xs, outs)) <= TOL["float16"]
