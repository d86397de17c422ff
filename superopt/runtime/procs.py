"""Kill a build worker together with the compilers it started, so an interrupt leaves nothing running; and wait for
a pool's jobs without being held for good by a worker that never returns (``wait_unstalled``).

A Triton build runs ``ptxas`` as a child of whichever process builds. When that process is a
worker (a spawn pool's, or a test's subprocess) and its parent is interrupted, the usual clean-up
kills the worker alone (``subprocess.run`` sends it SIGKILL; a pool waits for it to finish), and
the orphaned ``ptxas`` keeps a core busy for up to minutes. The helpers here kill the worker's
whole process tree instead, found through ``/proc`` before anything is killed (a killed parent's
children are re-parented and could no longer be found).

The workers stay in their parent's process group on purpose: a signal sent to the whole group (a
terminal's Ctrl-C, GNU ``timeout``) still reaches every one of them directly.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc (empty where there is no /proc)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except FileNotFoundError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:  # exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
        out[int(name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid``, parents before their children."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo += children.get(p, ())
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` (a child of this process, not yet reaped) and all of its descendants."""
    for p in [pid, *descendants(pid)]:  # the tree is read first: a dead parent's children move
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(args, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` whose child dies with its whole tree on any exception (KeyboardInterrupt,
    the timeout's TimeoutExpired), where ``subprocess.run`` kills the child alone."""
    timeout = kwargs.pop("timeout", None)
    check = kwargs.pop("check", False)
    if kwargs.pop("capture_output", False):
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(args, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except BaseException:
            kill_tree(proc.pid)
            raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, args, stdout, stderr)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def kill_pool(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's workers and everything they started now (their jobs are lost), then shut it down."""
    # concurrent.futures has no public handle on its workers before Python 3.14 (kill_workers)
    workers = list((pool._processes or {}).values())
    for w in workers:
        if w.pid is not None and w.exitcode is None:
            kill_tree(w.pid)
    pool.shutdown(wait=False, cancel_futures=True)


def wait_unstalled(futures: list, stall_s: float, last_progress: Callable[[], float] | None = None) -> set[int]:
    """Wait for ``futures``; the indices of those still not done once nothing has progressed for ``stall_s``
    (progress: one of them finishing, or the ``time.perf_counter()`` that ``last_progress`` returns moving on, e.g.
    another caller's task of the same pool finishing). A worker stuck for good (a lock held at a fork, a compiler
    that loops) then costs ``stall_s``, not the caller's life."""
    waiting, last = set(futures), time.perf_counter()
    while waiting:
        done, waiting = wait(waiting, timeout=min(10.0, stall_s), return_when=FIRST_COMPLETED)
        if done:
            last = time.perf_counter()
        if last_progress is not None:
            last = max(last, last_progress())
        if waiting and time.perf_counter() - last > stall_s:
            break
    return {i for i, f in enumerate(futures) if f in waiting}
