"""Every generated CUDA module compiles with NVRTC for sm_90a (no GPU needed), and the rendered
source matches its snapshot in tests/golden/codegen_cuda/ (regenerate: ``python -m
tests.superopt.codegen_cuda.test_cuda_nvrtc``, then review the diff)."""
from __future__ import annotations

import pathlib
import sys

import pytest

from superopt.codegen.cuda import compile_cuda, render_cuda
from superopt.codegen.cuda_nvrtc import cuda_include_dir, nvrtc_version
from superopt.codegen.cuda_prelude import PRELUDE
from tests.superopt.codegen_cuda.cases import all_cases, build

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "golden" / "codegen_cuda"
CASES = sorted(all_cases())
SNAPSHOTS = CASES  # fp16: the dtype served on the GPU


def test_nvrtc_and_headers_present():
    assert nvrtc_version() >= (12, 0)
    assert (pathlib.Path(cuda_include_dir()) / "cuda_fp16.h").exists()


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", CASES)
def test_compiles_for_sm90a(case, dtype):
    module = render_cuda(build(case, dtype).ugraph)
    cubin = compile_cuda(module, "sm_90a")
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 4096, f"{case}: {len(cubin)}-byte cubin"
    for k in module.kernels:  # every launch's entry point is in the image
        assert k.name.encode() in cubin, f"{case}: kernel {k.name} missing from the cubin"


def test_decode_matmul_uses_16_byte_paths():
    """A 16-byte aligned decode matmul streams its weights with 128-bit loads and stages its
    activations with cp.async, double-buffered across the for-loop."""
    src = render_cuda(build("rmsnorm_matmul_b3_k896_n256", "float16").ugraph).source
    body = src.split('extern "C" __global__', 1)[1]
    assert "= ldg_stream(bp" in body and "unpack(raw[u], bv, bp)" in body
    assert "cp_async16(" in body and "cp_async_wait<1>()" in body


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reduce_sum_output_plan(dtype):
    """Blocks that reduce into an output add float32 atomics into a zeroed buffer: the output
    itself in float32, else a float32 workspace that a second kernel converts."""
    module = render_cuda(build("splitk_matmul", dtype).ugraph)
    main = module.kernels[0]
    (z,) = main.zero
    assert main.params[z].dtype == "float32"
    assert main.params[z].role == ("out" if dtype == "float32" else "ws")
    assert "atomicAdd(o0 + " in module.source
    if dtype == "float32":
        assert len(module.kernels) == 1
    else:
        fin = module.kernels[1]
        assert fin.name == "finish_f32_float16" and [b.role for b in fin.params] == ["ws", "out"]
        assert fin.grid[0] * fin.block[0] >= fin.params[1].numel


def _snapshot(case: str) -> str:
    """The rendered module without the shared prelude (snapshotted once, as _prelude.cu)."""
    src = render_cuda(build(case, "float16").ugraph).source
    assert PRELUDE in src
    return src.replace(PRELUDE, "// <prelude: _prelude.cu>\n")


def test_prelude_matches_snapshot():
    assert PRELUDE == (GOLDEN / "_prelude.cu").read_text()


@pytest.mark.parametrize("case", SNAPSHOTS)
def test_source_matches_snapshot(case):
    path = GOLDEN / f"{case}.cu"
    assert path.exists(), f"missing snapshot {path}; run python -m tests.superopt.codegen_cuda.test_cuda_nvrtc"
    assert _snapshot(case) == path.read_text(), f"{case}: rendered CUDA differs from {path}"


def test_render_is_deterministic():
    case = "lora"
    assert _snapshot(case) == _snapshot(case)


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    (GOLDEN / "_prelude.cu").write_text(PRELUDE)
    for c in SNAPSHOTS:
        (GOLDEN / f"{c}.cu").write_text(_snapshot(c))
        print("wrote", GOLDEN / f"{c}.cu", file=sys.stderr)
