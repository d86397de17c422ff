"""The verifier's time at the real Llama-3-8B qkv shape (issue 2, Must-show 4).

x [8, 4096], W [4096, 6144]: RMSNorm → matmul against its fused μGraph with grid (1, 48, 1) and a
for-loop of 64. Run: ``python -m pytest -q -s -m slow tests/superopt/verify/test_verify_timing.py``.
"""
from __future__ import annotations

import time

import pytest

from superopt.verify import check_equivalent, float_rel_error

from tests.fixtures.graphs import rmsnorm_matmul, rmsnorm_matmul_program


@pytest.mark.slow
def test_llama3_8b_qkv_time_per_trial():
    prog, fused = rmsnorm_matmul_program(8, 4096, 6144), rmsnorm_matmul(8, 4096, 6144, 48, 64)
    trials = 3
    t0, c0 = time.perf_counter(), time.process_time()
    v = check_equivalent(prog, fused, trials=trials, float_check=False)
    per_trial = (time.perf_counter() - t0) / trials
    cpu_per_trial = (time.process_time() - c0) / trials  # all threads: the cost on a busy machine
    t1 = time.perf_counter()
    rel = float_rel_error(prog, fused, seed=0)
    t_float = time.perf_counter() - t1
    print(f"\nLlama-3-8B qkv [8,4096]x[4096,6144], grid (1,48,1), forloop 64: {per_trial:.2f} s per field "
          f"trial, {cpu_per_trial:.2f} s CPU ({trials} trials), float64 check {t_float:.2f} s (rel err {rel:.1g}); {v}")
    assert v.equivalent and rel < 1e-12
    assert per_trial < 10.0, "a trial at this shape takes well under a second on an idle 2-core CPU"
