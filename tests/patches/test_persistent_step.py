"""A patched model's decode step, recorded and run as one persistent launch (superopt.runtime.persistent)."""
from __future__ import annotations

from tests.interpreter import run_interpreted


def test_a_recorded_decode_step_runs_as_one_persistent_launch_with_the_same_results():
    r = run_interpreted("-m", "tests.patches.persistent_step_run")
    layer = ["attn_in_m1_fused", "attn_out_m1_fused", "mlp_in_m1_fused", "mlp_out_m1_fused"]
    assert r["programs"] == layer * 2 + ["norm_m1_fused"], "recording() missed or reordered site calls"
    assert (r["launches"], r["bodies"]) == (9, 5)  # one kernel a program here; the layers share the bodies
    waits = r["waits"]
    # layer 2's q/k/v reads the residual stream layer 1's down + residual wrote, and overwrites layer 1's q/k/v
    assert {0, 3} <= set(waits[4])
    assert waits[8] == [7]  # the final norm reads what the last down + residual wrote
    # the interpreter runs programs one after another, so the first takes every task in launch order: bit for bit
    assert r["max_abs_diff"] == 0.0
