"""Fused norm / activation μGraphs (issue 27) render to Triton and match float64 in its CPU interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.superopt.codegen.activations_interp_run import CASES

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def results() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.superopt.codegen.activations_interp_run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_fused_activation_kernel_matches_float64(results, case):
    kernels, err = results[case]
    assert kernels == 1
    assert err <= 1e-5  # fp32, CONVENTIONS.md
