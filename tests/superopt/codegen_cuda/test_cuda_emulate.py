"""Generated CUDA kernels, run by the CPU emulator, match the float64 reference (tolerance table).

Every fixture and odd shape in fp16, and (slow) in bf16; fp32 through the mutant test. A wrong μGraph
(a fixture mutant) must give a wrong answer through the same path, so the check can fail.
"""
from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest

from superopt.codegen.cuda import render_cuda
from tests.superopt.codegen_cuda import cpu_emulate as emu
from tests.superopt.codegen_cuda.cases import all_cases, build
from tests.fixtures.ugraphs import mutants, random_inputs

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++ (C++20)")

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}  # docs/conventions.md tolerance table
CASES = sorted(all_cases())


@functools.lru_cache(maxsize=None)
def _compiled(dtype: str):
    """All cases of one dtype in one g++ run (the shim's headers dominate the compile time)."""
    fixtures = [build(c, dtype) for c in CASES]
    modules = [render_cuda(fx.ugraph) for fx in fixtures]
    return fixtures, modules, emu.build(modules)


def _check(case: str, dtype: str, seed: int = 0) -> None:
    fixtures, modules, lib = _compiled(dtype)
    i = CASES.index(case)
    fx = fixtures[i]
    xs = random_inputs(fx, np.random.default_rng(seed))
    # the reference sees the inputs the kernel sees: rounded to the dtype
    ref = fx.reference([emu.from_storage(emu.to_storage(x, dtype), dtype) for x in xs])
    got = emu.run(modules[i], fx.ugraph, xs, lib, f"m{i}")
    for g, r in zip(got, ref):
        assert np.isfinite(g).all(), f"{case} {dtype}: non-finite outputs (unwritten or read before written)"
        err = np.linalg.norm(g - r) / np.linalg.norm(r)
        assert err <= TOL[dtype], f"{case} {dtype}: relative error {err:.3e} > {TOL[dtype]}"


@pytest.mark.parametrize("case", CASES)
def test_fp16_matches_reference(case):
    _check(case, "float16")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_bf16_matches_reference(case):
    _check(case, "bfloat16", seed=1)


def test_fp32_mutants_are_caught():
    """fp32 fixtures pass; each of their mutants, rendered and run the same way, misses the reference."""
    runs = []
    for name in ("rmsnorm_matmul", "decode_attention"):
        fx = build(name, "float32")
        runs += [(fx, "original", fx.ugraph)] + [(fx, label, g) for label, g in mutants(fx)]
    modules = [render_cuda(g) for _, _, g in runs]
    lib = emu.build(modules)
    for i, ((fx, label, g), m) in enumerate(zip(runs, modules)):
        xs = random_inputs(fx, np.random.default_rng(2))
        (ref,) = fx.reference(xs)
        (got,) = emu.run(m, g, xs, lib, f"m{i}")
        err = np.linalg.norm(np.nan_to_num(got - ref, nan=1e30)) / np.linalg.norm(ref)
        if label == "original":
            assert err <= TOL["float32"], f"{fx.name} float32: relative error {err:.3e}"
        else:
            assert err > 1e-3, f"{fx.name} mutant {label} matched the reference ({err:.2e}): the check cannot fail"
