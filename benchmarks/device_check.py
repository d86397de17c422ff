"""Run every GPU test of the Triton codegen and runtime on the device machine; print a short summary.

    PYTHONPATH=$PWD python benchmarks/device_check.py
"""
from __future__ import annotations

import sys
import time

import pytest
import torch


def main() -> int:
    props = torch.cuda.get_device_properties(0)
    import triton
    print(f"device {props.name}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    t0 = time.time()
    rc = pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE", "--tb=short",
                      "tests/codegen/test_triton_gpu.py"])
    print(f"device_check: pytest exit {int(rc)} in {time.time() - t0:.0f} s", flush=True)
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
