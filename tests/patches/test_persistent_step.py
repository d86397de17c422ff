"""A patched model's decode step, recorded and run as persistent launches (superopt.runtime.persistent)."""
from __future__ import annotations

import pytest

from superopt.runtime.persistent import PersistentRun, segments
from tests.interpreter import run_interpreted


def test_a_recorded_decode_step_runs_as_persistent_launches_with_the_same_results():
    r = run_interpreted("-m", "tests.patches.persistent_step_run")
    layer = ["attn_in_m1_fused", "decode attention", "attn_out_m1_fused", "mlp_in_m1_fused", "mlp_out_m1_fused"]
    assert r["recorded"] == layer * 2 + ["norm_m1_fused"], "recording() missed or reordered the step's work"
    # between attention launches: q/k/v; o+res, gate/up, down+res, next q/k/v; o+res, gate/up, down+res, final norm
    assert r["segments"] == [1, 4, 4]
    assert (r["launches"], r["bodies"]) == (9, 5)  # one kernel a program here; the layers share the bodies
    waits = r["waits"]
    # layer 2's q/k/v reads the residual stream layer 1's down + residual wrote, and overwrites layer 1's q/k/v
    assert {0, 3} <= set(waits[4])
    assert waits[8] == [7]  # the final norm reads what the last down + residual wrote
    # the interpreter runs programs one after another, so the first takes every task in launch order: bit for bit
    assert r["whole_diff"] == 0.0 and r["segments_diff"] == 0.0


def test_segments_cut_a_recording_where_other_work_ran_and_a_run_refuses_to_span_it():
    a, b, c = (object(), []), (object(), []), (object(), [])
    recorded = [(None, "decode attention"), a, (None, "decode attention"), b, c, (None, "x"), (None, "y")]
    assert segments(recorded) == [[a], [b, c]]
    with pytest.raises(ValueError, match="decode attention"):
        PersistentRun(recorded)
