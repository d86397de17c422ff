"""Equivalence checks of large μGraphs, their independent trials spread over one pool of worker processes.

A μGraph from a cache that this user did not sign (shipped, imported) is verified against the
site's program on first use (docs/architecture.md, "Cache trust"), at the program's own shape: for
Llama-3.1-8B's MLP that is ~2 s of one CPU core per finite-field trial (weights of 4096 x 14336),
most of it drawing the random inputs. The trials are independent by construction (each draws its
inputs and uninterpreted-function keys from its own seed), so running trial ``i`` as
``check_equivalent(trials=1, seed=i)`` in its own process gives the same test and the same bound,
ε^k for k trials, in the time of one trial. The float64 check runs as a task of its own.

How many trials. ``trials_for(ε)``: the fewest (at least ``MIN_TRIALS``, at most ``TRIALS``, the
search's 8) that bring the bound ε^k under ``TARGET_BOUND`` = 1e-18, the probability that a
non-equivalent μGraph passes. ε comes from the degree analysis (``superopt.verify.degree``) before
any trial runs. Llama-3.1-8B's sites have ε between 2e-9 and 4e-7, so 3 trials (bounds 7e-27 to
6e-20) instead of 8 (1e-70 to 7e-52): both are far below any failure rate of the hardware that
runs the kernel. Attention-like graphs with ε ≈ 1e-3 get 6 trials; a graph whose ε is near 1 (no
guarantee at that shape) still gets 8, and the Verdict prints the bound whatever it is.

One pool for the whole process: ``prefetch(program, candidate)`` submits a check without waiting,
so patch() can start every cached μGraph's verification at once (``patching.prepare``) and collect
each result with ``check`` when the site needs it; the trials of all programs then share the cores
instead of running program after program. The pool has one worker per core but one (the parent
keeps building kernels meanwhile).

Small programs (under ``MIN_ELEMENTS`` input elements), or a machine with one core or without
``fork``, verify in this process: starting the pool costs about a second. Workers are forked, once
per process, and reused: ``spawn`` and ``forkserver`` would run the user's main script again in each
worker (a script that calls ``patch()`` without an ``if __name__ == "__main__"`` guard would load its
model once per worker). A forked worker only runs numpy; it never touches the parent's CUDA
context (as PyTorch's DataLoader workers, forked from CUDA processes by default).

A fork copies one thread of a process that may run several (CUDA's, the pool's own manager), so a lock another
thread held at the fork stays held in the child, and a worker can hang on it forever (Python warns of it). Once
no task of the pool has finished for ``STALL_SECONDS`` while a check waits on it, the check kills the pool and
verifies in this process, as it does when a worker dies: patch() gets slower, never stuck.
"""
from __future__ import annotations

import atexit
import dataclasses
import math
import multiprocessing
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from superopt.ir import KernelGraph, digest
from superopt.runtime.procs import kill_pool, wait_unstalled
from superopt.verify import check_equivalent
from superopt.verify.degree import trial_bound
from superopt.verify.equivalence import check_inputs
from superopt.verify.fields import default_field

TRIALS = 8               # the most trials a check runs (check_equivalent's default)
MIN_TRIALS = 2           # never fewer: one trial's bound alone is not the quoted guarantee
TARGET_BOUND = 1e-18     # Pr[a non-equivalent μGraph passes] every check reaches where ε allows
MIN_ELEMENTS = 4_000_000  # input elements of the program below which one process is quicker
STALL_SECONDS = 120.0    # no task of the pool finished for this long while a check waits: a worker is stuck

_pool: ProcessPoolExecutor | None = None
_pending: dict[tuple[str, str], "_Pending"] = {}   # prefetched checks, by (program, candidate) digest
_last_done = 0.0   # time.perf_counter() when a task of the pool last finished


class PoolStalled(RuntimeError):
    """No task of the pool finished for ``STALL_SECONDS`` while a check waited on it."""


def trials_for(eps: float) -> int:
    """The fewest trials k in [MIN_TRIALS, TRIALS] with eps**k <= TARGET_BOUND (TRIALS if none)."""
    if eps <= 0.0:
        return MIN_TRIALS
    if eps >= 1.0:
        return TRIALS
    return max(MIN_TRIALS, min(TRIALS, math.ceil(math.log(TARGET_BOUND) / math.log(eps) - 1e-9)))


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def _one_blas_thread() -> None:
    """Pool initializer: each worker's BLAS on one thread. The pool already runs a process per core, and the
    OpenBLAS that numpy loaded in the parent starts a thread per core in every forked worker (15 × 16 spinning
    threads on a 16-core host), so the float64 limb matmuls of the trials fought for the cores: Llama-3.1-8B's 12
    shipped μGraphs verified in 13.7 s with the default, 8.9 s with one thread, on 2 cores
    (``benchmarks/verify_first_use.py``). threadpoolctl finds whichever BLAS and OpenMP runtimes are loaded; an
    environment without it (a GPU host's own, installed with --no-deps) keeps the default."""
    global _limits
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    _limits = threadpool_limits(1)  # held for the worker's life


_limits = None


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max(2, cores() - 1), mp_context=multiprocessing.get_context("fork"),
                                    initializer=_one_blas_thread)
        atexit.register(_pool.shutdown, wait=False, cancel_futures=True)
    return _pool


def _drop_pool() -> None:
    """Kill the pool's workers (a stuck one never returns, and shutting down would wait for it) and forget it."""
    global _pool
    if _pool is not None:
        kill_pool(_pool)
        _pool = None
    _pending.clear()


def _note_done(_future) -> None:
    global _last_done
    _last_done = time.perf_counter()


def _task(program: KernelGraph, candidate: KernelGraph, seed: int, trials: int, float_check: bool):
    return check_equivalent(program, candidate, trials=trials, seed=seed, float_check=float_check)


def _parallel(program: KernelGraph, min_elements: int | None) -> bool:
    least = MIN_ELEMENTS if min_elements is None else min_elements
    large = sum(v.type.numel for v in program.inputs) >= least
    return large and cores() >= 2 and "fork" in multiprocessing.get_all_start_methods()


def _compile(text: str, launch, pdl: bool, target, ordered_sums: bool = False) -> int | str:
    """Worker: ``superopt.runtime.precompile`` (compiles, launches nothing); an error is only
    returned, since the build in the parent compiles whatever is not in Triton's cache."""
    try:
        from superopt.runtime.precompile import precompile
        return precompile(text, launch, pdl, target, ordered_sums)
    except Exception as e:
        return f"{type(e).__name__}: {e}"


class _Pending:
    """A check submitted to the pool: ``trials`` field trials (task i: seed i) and the float64 check;
    with ``compile_job`` (``_compile``'s arguments), the candidate's kernels compiled first, so the
    build after a passed check loads them from Triton's cache."""

    def __init__(self, program: KernelGraph, candidate: KernelGraph, compile_job: tuple | None = None):
        self.program, self.candidate, self.t0 = program, candidate, time.perf_counter()
        self.trials = trials_for(_eps(program, candidate))
        pool = _get_pool()
        self.compiling = pool.submit(_compile, *compile_job) if compile_job else None
        self.futures = [pool.submit(_task, program, candidate, i, 1, False) for i in range(self.trials)]
        self.futures.append(pool.submit(_task, program, candidate, 0, 0, True))
        for f in self.futures + [self.compiling] * bool(compile_job):
            f.add_done_callback(_note_done)

    def result(self):
        try:
            # the compile first: done before the build that wants its binaries (a failed compile is not read: the
            # build compiles instead); a pool where no task of any check finished for STALL_SECONDS is stuck
            for futures in ([self.compiling] if self.compiling else [], self.futures):
                if wait_unstalled(futures, STALL_SECONDS, lambda: _last_done):
                    raise PoolStalled(f"no verification task finished in {STALL_SECONDS:.0f} s")
            verdicts = [f.result() for f in self.futures]
        except (BrokenProcessPool, OSError, PoolStalled) as e:   # a worker killed (out of memory) or stuck
            _drop_pool()
            warnings.warn(f"mirage_serve: verification workers failed ({type(e).__name__}: {e}); verifying "
                          "in this process", RuntimeWarning, stacklevel=3)
            return check_equivalent(self.program, self.candidate, trials=self.trials)
        k = self.trials
        trials, flt = verdicts[:k], verdicts[k]
        for i, v in enumerate(trials):
            if not v.equivalent:
                return dataclasses.replace(v, reason=f"{v.reason} (independent trial {i} of {k})",
                                           seconds=time.perf_counter() - self.t0)
        if not flt.equivalent:
            return dataclasses.replace(flt, trials_run=k, seconds=time.perf_counter() - self.t0)
        eps = trials[0].per_trial_bound
        return dataclasses.replace(trials[0], trials_run=k, error_bound=eps ** k,
                                   float_rel_error=flt.float_rel_error, seconds=time.perf_counter() - self.t0)


def _eps(program: KernelGraph, candidate: KernelGraph) -> float:
    """ε of one trial; 1 (the most trials) where the graphs do not even match in outputs, which
    check_equivalent then reports."""
    f = default_field()
    try:
        return trial_bound(program, candidate, f.p, f.q)
    except Exception:
        return 1.0


def prefetch(program: KernelGraph, candidate: KernelGraph, min_elements: int | None = None,
             compile_job: tuple | None = None) -> None:
    """Start ``check(program, candidate)`` in the pool without waiting (nothing for a small program,
    which ``check`` verifies in this process), after ``compile_job`` (``(μGraph text, launch, pdl,
    GPUTarget, ordered_sums)``: the candidate's kernels compiled into Triton's cache, nothing run; ``check`` waits
    for it too). Any failure to start it is left for ``check`` to meet."""
    key = (digest(program), digest(candidate))
    if key in _pending or candidate == program or not _parallel(program, min_elements):
        return
    try:
        check_inputs(program, candidate)
        _pending[key] = _Pending(program, candidate, compile_job)
    except Exception:   # a malformed candidate, no processes: check() reports it when it is asked
        return


def forget() -> None:
    """Drop the prefetched checks nobody collected (a site that failed first): their queued tasks
    are cancelled, running ones finish unread."""
    for pending in _pending.values():
        for f in pending.futures:
            f.cancel()
    _pending.clear()


def check(program: KernelGraph, candidate: KernelGraph, min_elements: int | None = None):
    """``check_equivalent(program, candidate)``'s Verdict with ``trials_for(ε)`` trials and the
    float64 check, run in the pool when the program is large and the machine has the cores (taking
    the prefetched check if one is in flight)."""
    pending = _pending.pop((digest(program), digest(candidate)), None)
    if pending is not None:
        return pending.result()
    check_inputs(program, candidate)   # as check_equivalent would, before ε or any process
    if not _parallel(program, min_elements):
        return check_equivalent(program, candidate, trials=trials_for(_eps(program, candidate)))
    try:
        pending = _Pending(program, candidate)
    except (BrokenProcessPool, OSError) as e:
        _drop_pool()
        warnings.warn(f"mirage_serve: verification workers failed ({type(e).__name__}: {e}); verifying "
                      "in this process", RuntimeWarning, stacklevel=2)
        return check_equivalent(program, candidate, trials=trials_for(_eps(program, candidate)))
    return pending.result()
