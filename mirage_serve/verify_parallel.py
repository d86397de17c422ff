"""Equivalence checks of large μGraphs with their independent trials spread over worker processes.

A μGraph from a cache that this user did not sign (shipped, imported) is verified against the
site's program on first use (docs/architecture.md, "Cache trust"), at the program's own shape: for
Llama-3.1-8B's MLP that is ~2 s of one CPU core per finite-field trial (weights of 4096 x 14336),
and ``check_equivalent`` runs 8 of them and a float64 check in a row. The trials are independent
by construction (each draws its inputs and uninterpreted-function keys from its own seed), so
running trial ``i`` as ``check_equivalent(trials=1, seed=i)`` in its own process gives the same
test and the same bound, ε^8, in the time of one trial. The float64 check runs as a ninth task.

Small programs (under ``MIN_ELEMENTS`` input elements), or a machine with one core or without
``fork``, verify in this process: starting the pool costs about a second. Workers are forked, once
per process, and reused: ``spawn`` and ``forkserver`` would run the user's main script again in each
worker (a script that calls ``patch()`` without an ``if __name__ == "__main__"`` guard would load its
model once per worker). A forked worker only runs numpy; it never touches the parent's CUDA
context (as PyTorch's DataLoader workers, forked from CUDA processes by default).
"""
from __future__ import annotations

import atexit
import dataclasses
import multiprocessing
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from superopt.ir import KernelGraph
from superopt.verify import check_equivalent

TRIALS = 8               # check_equivalent's default: the bound quoted in its Verdict
MIN_ELEMENTS = 4_000_000  # input elements of the program below which one process is quicker

_pool: ProcessPoolExecutor | None = None


def _workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(min(TRIALS + 1, _workers()), mp_context=multiprocessing.get_context("fork"))
        atexit.register(_pool.shutdown, wait=False, cancel_futures=True)
    return _pool


def _drop_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


def _task(program: KernelGraph, candidate: KernelGraph, seed: int, trials: int, float_check: bool):
    return check_equivalent(program, candidate, trials=trials, seed=seed, float_check=float_check)


def check(program: KernelGraph, candidate: KernelGraph, min_elements: int = MIN_ELEMENTS):
    """``check_equivalent(program, candidate)``'s Verdict: 8 trials and the float64 check, run in
    parallel processes when the program is large and the machine has the cores."""
    small = sum(v.type.numel for v in program.inputs) < min_elements
    if small or _workers() < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return check_equivalent(program, candidate, trials=TRIALS)
    t0 = time.perf_counter()
    try:
        pool = _get_pool()
        # task i < TRIALS: trial i alone (seed i); the last: the float64 check alone (no trial)
        futures = [pool.submit(_task, program, candidate, i, 1, False) for i in range(TRIALS)]
        futures.append(pool.submit(_task, program, candidate, 0, 0, True))
        verdicts = [f.result() for f in futures]
    except (BrokenProcessPool, OSError) as e:   # a worker killed (out of memory), no processes left
        _drop_pool()
        warnings.warn(f"mirage_serve: verification workers failed ({type(e).__name__}: {e}); verifying "
                      "in this process", RuntimeWarning, stacklevel=2)
        return check_equivalent(program, candidate, trials=TRIALS)
    trials, flt = verdicts[:TRIALS], verdicts[TRIALS]
    for i, v in enumerate(trials):
        if not v.equivalent:
            return dataclasses.replace(v, reason=f"{v.reason} (independent trial {i} of {TRIALS})",
                                       seconds=time.perf_counter() - t0)
    if not flt.equivalent:
        return dataclasses.replace(flt, trials_run=TRIALS, seconds=time.perf_counter() - t0)
    eps = trials[0].per_trial_bound
    return dataclasses.replace(trials[0], trials_run=TRIALS, error_bound=eps ** TRIALS,
                               float_rel_error=flt.float_rel_error, seconds=time.perf_counter() - t0)
