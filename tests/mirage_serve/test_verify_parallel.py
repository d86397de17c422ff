"""Verification with the trials over worker processes: the same test and bound as check_equivalent."""
from __future__ import annotations

import os
import time

import pytest
from superopt.ir import from_text, to_text
from superopt.verify import check_equivalent
from tests.fixtures.procs import gone
from tests.fixtures.ugraphs import FIXTURES

from mirage_serve import verify_parallel


def test_parallel_trials_give_check_equivalents_verdict_and_reject_a_forgery():
    fx = FIXTURES["rmsnorm_matmul"](dtype="float32", rows=3, hidden=90, out=70)
    alone = check_equivalent(fx.program, fx.ugraph)
    spread = verify_parallel.check(fx.program, fx.ugraph, min_elements=0)
    k = verify_parallel.trials_for(alone.per_trial_bound)
    assert spread.equivalent and spread.trials_run == k and alone.trials_run == verify_parallel.TRIALS
    assert spread.error_bound == alone.per_trial_bound ** k <= verify_parallel.TARGET_BOUND
    assert spread.float_rel_error <= 1e-9
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
    assert v.equivalent and v.trials_run == verify_parallel.trials_for(v.per_trial_bound)
    assert verify_parallel._pool is None


def _hang(*args):
    time.sleep(90)   # a forked worker stuck on a lock another thread of its parent held at the fork (bounded:
                     # without the stall guard this test fails after 90 s instead of hanging the suite)


def test_a_stuck_worker_is_killed_and_the_check_runs_in_this_process(monkeypatch):
    fx = FIXTURES["rmsnorm_matmul"](dtype="float32", rows=3, hidden=90, out=70)
    verify_parallel._drop_pool()
    monkeypatch.setattr(verify_parallel, "_task", _hang)
    monkeypatch.setattr(verify_parallel, "STALL_SECONDS", 2.0)
    pool = verify_parallel._get_pool()
    pool.submit(int).result()   # its workers started
    workers = list(pool._processes.values())
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="PoolStalled.*verifying in this process"):
        v = verify_parallel.check(fx.program, fx.ugraph, min_elements=0)
    assert time.perf_counter() - t0 < 30
    assert v.equivalent and v.trials_run == verify_parallel.trials_for(v.per_trial_bound)
    assert verify_parallel._pool is None
    assert all(gone(w.pid) for w in workers)   # killed, not left sleeping


def test_trials_reach_the_target_bound():
    t = verify_parallel.trials_for
    assert t(4e-7) == 3 and t(1.9e-9) == 3 and t(1e-3) == 6 and t(1e-10) == verify_parallel.MIN_TRIALS
    assert t(0.5) == t(1.0) == verify_parallel.TRIALS
    for eps in (1e-12, 1e-9, 3.3e-8, 4e-7, 1e-4, 1e-3):
        assert eps ** t(eps) <= verify_parallel.TARGET_BOUND < eps ** (t(eps) - 1) or t(eps) == verify_parallel.MIN_TRIALS


def test_a_prefetched_check_is_the_same_check_and_rejects_a_forgery():
    fx = FIXTURES["rmsnorm_matmul"](dtype="float32", rows=3, hidden=90, out=70)
    forged = from_text(to_text(fx.ugraph).replace("value=1e-06", "value=1.001e-06"))
    verify_parallel.prefetch(fx.program, fx.ugraph, min_elements=0)
    verify_parallel.prefetch(fx.program, forged, min_elements=0)
    assert len(verify_parallel._pending) == 2
    bad = verify_parallel.check(fx.program, forged)   # taken from the pool, whatever the size rule says
    good = verify_parallel.check(fx.program, fx.ugraph)
    assert not verify_parallel._pending
    assert not bad.equivalent and "independent trial" in bad.reason
    assert good.equivalent and good.error_bound <= verify_parallel.TARGET_BOUND


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_each_worker_runs_its_blas_on_one_thread():
    # a thread per core in each of a process per core fought for the cores (13.7 s against 8.9 s on 2)
    pytest.importorskip("threadpoolctl")
    import numpy  # noqa: F401  (BLAS loaded before the fork, as in patch())
    threads = verify_parallel._get_pool().submit(_blas_threads).result()
    assert threads and set(threads) == {1}, threads
