"""Run every GPU test of the Triton codegen and runtime on the device machine; print a short summary.

Kernels are compiled first by a pool of processes (into Triton's on-disk cache), then pytest runs
the gpu-marked tests alone on the GPU.

    PYTHONPATH=$PWD python benchmarks/device_check.py
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch


def _warm(case_dtype: tuple[str, str]) -> str:
    from superopt.runtime import compile_graph
    from tests.superopt.codegen.triton_cases import build

    case, dtype = case_dtype
    try:
        fx = build(case, dtype)
        xs = [torch.randn(v.type.shape, device="cuda").to(getattr(torch, dtype)) for v in fx.program.inputs]
        compile_graph(fx.ugraph)(*xs)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # pytest reports it properly
        return f"{case}/{dtype}: {type(e).__name__}: {str(e)[:300]}"


def main(workers: int = 12) -> int:
    from tests.superopt.codegen.triton_cases import CASES

    props = torch.cuda.get_device_properties(0)
    import triton
    print(f"device {props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    t0 = time.time()
    jobs = [(c[0], dt) for c in CASES for dt in ("bfloat16", "float16")]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for msg in ex.map(_warm, jobs):
            if msg:
                print("warm:", msg, flush=True)
    print(f"compiled ahead in {time.time() - t0:.0f} s", flush=True)
    rc = pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE", "--tb=short",
                      "tests/superopt/codegen/test_triton_gpu.py"])
    print(f"device_check: pytest exit {int(rc)} in {time.time() - t0:.0f} s", flush=True)
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
