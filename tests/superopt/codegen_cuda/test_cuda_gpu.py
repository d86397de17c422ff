"""GPU checks of the CUDA backend: every case in fp16 and bf16 against the float64 reference,
outputs poisoned beforehand; CUDA-graph capture and replay; 16-byte loads in the SASS."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from tests.superopt.codegen_cuda.cases import all_cases, build, compile_all

pytestmark = pytest.mark.gpu
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}  # docs/conventions.md tolerance table
CASES = sorted(all_cases())
DTYPES = ("float16", "bfloat16")


@functools.lru_cache(maxsize=1)
def _cubins() -> dict[tuple[str, str], bytes]:
    """Every case's cubin, compiled once in parallel before the first test needs one."""
    return compile_all([(c, d) for c in CASES for d in DTYPES], workers=os.cpu_count() or 4)


def _runner(case: str, dtype: str):
    from superopt.codegen.cuda import render_cuda
    from superopt.runtime.cuda_launch import CudaGraphRunner
    fx = build(case, dtype)
    cubin = _cubins()[(case, dtype)]
    return fx, CudaGraphRunner(fx.ugraph, cubin, "cuda", render_cuda(fx.ugraph))


def _torch():
    import torch
    return torch


def _inputs(fx, dtype, seed):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    return [torch.randn(v.type.shape, generator=g, device="cuda", dtype=torch.float32).to(dt)
            for v in fx.ugraph.inputs]


def _poison(runner) -> None:
    for t in list(runner.buffers.values()) + list(runner.workspaces.values()):
        if t.is_floating_point():
            t.fill_(float("nan"))


def _error(fx, xs, outs) -> list[float]:
    ref = fx.reference([x.double().cpu().numpy() for x in xs])
    errs = []
    for o, r in zip(outs, ref):
        got = o.double().cpu().numpy()
        assert np.isfinite(got).all(), "non-finite outputs: unwritten or read before written"
        errs.append(float(np.linalg.norm(got - r) / np.linalg.norm(r)))
    return errs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_case_matches_reference(case, dtype):
    torch = _torch()
    fx, runner = _runner(case, dtype)
    for seed in (0, 1):  # fresh inputs each call; a race shows as a changing error
        xs = _inputs(fx, dtype, seed)
        _poison(runner)
        outs = runner(*xs)
        torch.cuda.synchronize()
        for err in _error(fx, xs, outs):
            assert err <= TOL[dtype], f"{case} {dtype} seed {seed}: relative error {err:.3e}"


@pytest.mark.parametrize("case", ["rmsnorm_matmul_b3_k896_n256", "splitk_matmul", "decode_attention",
                                  "lora", "gqa"])
def test_cuda_graph_replay(case):
    """Captured once, replayed on new inputs copied into the static ones: same answers."""
    torch = _torch()
    dtype = "bfloat16"
    fx, runner = _runner(case, dtype)
    static = _inputs(fx, dtype, 0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        runner(*static)  # warm-up on a side stream, as torch's capture recipe does
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = runner(*static)
    for seed in (3, 4):
        fresh = _inputs(fx, dtype, seed)
        for s, f in zip(static, fresh):
            s.copy_(f)
        _poison(runner)
        graph.replay()
        torch.cuda.synchronize()
        for err in _error(fx, fresh, outs):
            assert err <= TOL[dtype], f"{case} replay seed {seed}: relative error {err:.3e}"


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not installed")
def test_sass_has_128_bit_loads(tmp_path):
    """The decode matmul's weights stream with LDG.E.*.128 and its activations arrive by LDGSTS (cp.async)."""
    from superopt.codegen.cuda import compile_cuda, render_cuda
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(compile_cuda(render_cuda(build("rmsnorm_matmul_b3_k896_n256", "float16").ugraph)))
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"\bLDG\.E\.[\w.]*128\b", sass), "no 128-bit global loads in the SASS"
    assert re.search(r"\bLDGSTS\.[\w.]*128\b", sass), "no 16-byte cp.async (LDGSTS) in the SASS"


def test_custom_op_under_torch_compile():
    """The CUDA runner as a torch.library op inside torch.compile gives the eager answer."""
    from superopt.runtime.cuda_op import as_custom_op
    torch = _torch()
    dtype = "bfloat16"
    fx, runner = _runner("rmsnorm_matmul_b3_k896_n256", dtype)
    op = as_custom_op(runner, "gpu_test_rmsnorm_matmul_bf16")
    xs = _inputs(fx, dtype, 7)
    compiled = torch.compile(lambda *a: op(list(a))[0] * 2, fullgraph=True)  # exact in bf16
    got = compiled(*xs)
    torch.cuda.synchronize()
    (err,) = _error(fx, xs, [got / 2])
    assert err <= TOL[dtype]
