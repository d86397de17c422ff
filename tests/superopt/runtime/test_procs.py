"""An interrupted build leaves no compiler running: a worker dies with the processes it started.

The stand-in for ptxas is a `sleep` started by a worker (a test's subprocess, a spawn pool's
worker), as Triton starts ptxas. The interrupt is a real KeyboardInterrupt raised in this process
while it waits for the worker, once the worker has written the stand-in's pid.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.procs import gone

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or not hasattr(signal, "setitimer"),
                                reason="needs Linux /proc and interval timers")

# A worker that starts a long child (the "compiler"), records its pid, and waits for it.
_WORKER = ("import subprocess, sys; p = subprocess.Popen(['sleep', '300']); "
           "open(sys.argv[1], 'w').write(str(p.pid)); p.wait()")


def start_compiler_and_wait(pid_file: str) -> None:
    """Pool job (importable, for spawn): as _WORKER, inside a pool worker; writes "worker compiler"."""
    p = subprocess.Popen(["sleep", "300"])
    Path(pid_file).write_text(f"{os.getpid()} {p.pid}")
    p.wait()


@contextlib.contextmanager
def interrupt_once_written(pid_file: Path):
    """Raise KeyboardInterrupt in this (main) thread as soon as ``pid_file`` holds a pid."""
    def tick(signum, frame):
        if pid_file.exists() and pid_file.read_text():
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cleanup(pid_file: Path) -> None:
    if pid_file.exists() and pid_file.read_text():  # never leave the stand-in running, whatever failed
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[-1]), signal.SIGKILL)


def test_descendants_lists_children_and_grandchildren(tmp_path):
    from superopt.runtime import procs

    pid_file = tmp_path / "pid"
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        sleeper = int(pid_file.read_text())
        assert worker.pid in procs.descendants(os.getpid())
        assert procs.descendants(worker.pid) == [sleeper]
        procs.kill_tree(worker.pid)
        worker.wait(timeout=30)
        assert worker.returncode == -signal.SIGKILL and gone(sleeper)
    finally:
        _cleanup(pid_file)


def test_interrupted_run_kills_the_workers_compiler(tmp_path):
    from superopt.runtime import procs

    pid_file = tmp_path / "pid"
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_once_written(pid_file):
            procs.run([sys.executable, "-c", _WORKER, str(pid_file)], capture_output=True, text=True, timeout=120)
        assert gone(int(pid_file.read_text()))  # subprocess.run would have killed the worker alone
    finally:
        _cleanup(pid_file)


def test_run_returns_like_subprocess_run():
    from superopt.runtime import procs

    r = procs.run([sys.executable, "-c", "import sys; print('out 73'); sys.exit(3)"], capture_output=True,
                  text=True, timeout=120)
    assert (r.returncode, r.stdout) == (3, "out 73\n")
    with pytest.raises(subprocess.CalledProcessError):
        procs.run([sys.executable, "-c", "raise SystemExit(5)"], check=True, timeout=120)


def test_interrupted_pool_map_kills_the_workers_and_their_compilers(tmp_path):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from superopt.runtime.select import map_isolating_crashes

    def new_pool():
        return ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))

    pool = new_pool()
    pid_file = tmp_path / "pid"
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_once_written(pid_file):
            map_isolating_crashes(pool, new_pool, start_compiler_and_wait, [str(pid_file)])
        worker, compiler = map(int, pid_file.read_text().split())
        assert gone(compiler) and gone(worker)  # a plain pool would let the worker finish its job
    finally:
        _cleanup(pid_file)
        pool.shutdown(wait=False, cancel_futures=True)
