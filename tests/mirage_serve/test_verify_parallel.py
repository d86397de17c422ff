"""Verification with the trials over worker processes: the same test and bound as check_equivalent."""
from __future__ import annotations

import os

import pytest
from superopt.ir import from_text, to_text
from superopt.verify import check_equivalent
from tests.fixtures.ugraphs import FIXTURES

from mirage_serve import verify_parallel


def test_parallel_trials_give_check_equivalents_verdict_and_reject_a_forgery():
    fx = FIXTURES["rmsnorm_matmul"](dtype="float32", rows=3, hidden=90, out=70)
    alone = check_equivalent(fx.program, fx.ugraph)
    spread = verify_parallel.check(fx.program, fx.ugraph, min_elements=0)
    assert spread.equivalent and spread.trials_run == alone.trials_run == verify_parallel.TRIALS
    assert spread.error_bound == alone.error_bound and spread.float_rel_error <= 1e-9
    forged = from_text(to_text(fx.ugraph).replace("value=1e-06", "value=1.001e-06"))
    assert forged != fx.ugraph
    bad = verify_parallel.check(fx.program, forged, min_elements=0)
    assert not bad.equivalent and "independent trial 0" in bad.reason


def _die(*args):
    os._exit(9)   # a worker killed mid-trial (out of memory)


def test_a_broken_pool_falls_back_to_this_process(monkeypatch):
    fx = FIXTURES["rmsnorm_matmul"](dtype="float32", rows=3, hidden=90, out=70)
    verify_parallel._drop_pool()
    monkeypatch.setattr(verify_parallel, "_task", _die)
    with pytest.warns(RuntimeWarning, match="verifying in this process"):
        v = verify_parallel.check(fx.program, fx.ugraph, min_elements=0)
    assert v.equivalent and v.trials_run == verify_parallel.TRIALS and verify_parallel._pool is None
