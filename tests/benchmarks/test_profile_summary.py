"""The decode-step profile summary: per-kernel aggregation, busy time with overlaps, idle gaps."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_decode_step.py"
_spec = importlib.util.spec_from_file_location("profile_decode_step", _PATH)
prof = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = prof  # dataclasses look their module up there
_spec.loader.exec_module(prof)


def test_summary_counts_overlap_once_and_reports_gaps_per_step():
    K = prof.KernelSpan
    # two steps: a(0-10) b(12-20) | a(30-40) b(35-50): gaps 2 and 10; overlap of 5 in step 2
    spans = [K("b", 12, 20), K("a", 0, 10), K("a", 30, 40), K("b", 35, 50)]
    s = prof.summarize(spans, steps=2)
    assert s["kernels_per_step"] == 2
    assert s["wall_us"] == pytest.approx(25.0)           # (50 - 0) / 2
    assert s["busy_us"] == pytest.approx((10 + 8 + 20) / 2)
    assert s["gap_us"] == pytest.approx((50 - 38) / 2)
    rows = {n: (c, us) for n, c, us in s["rows"]}
    assert rows["a"] == (1.0, 10.0) and rows["b"] == (1.0, 11.5)
    assert s["rows"][0][0] == "b"  # sorted by time, largest first


def test_summary_of_nothing_is_zero():
    s = prof.summarize([], steps=4)
    assert s["busy_us"] == 0 and s["wall_us"] == 0 and s["rows"] == []
