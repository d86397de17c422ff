"""Start N copies of a command under torchrun, with NVLink multicast off in every one.

``mirage-serve bench MODEL --tp N`` re-runs itself through `launch`; `torchrun_line` is the one line
a user can run by hand instead. ``--standalone`` picks a free local rendezvous port, so runs on one
host never collide.
"""
from __future__ import annotations

import shlex
import subprocess
import sys

from .safety import MULTICAST_OFF, multicast_off_env


def torchrun_argv(nproc: int, argv: list[str], python: str | None = None) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N <argv>`` (argv: a script
    and its arguments, or ``-m module …``)."""
    if nproc < 1:
        raise ValueError(f"--tp must be a positive number of processes, got {nproc}")
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *argv]


def torchrun_line(nproc: int, argv: list[str]) -> str:
    """The shell line that starts ``argv`` on ``nproc`` ranks, the multicast-off variables included."""
    env = " ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items())
    return f"{env} {shlex.join(torchrun_argv(nproc, argv, python='python'))}"


def launch(nproc: int, argv: list[str], env: dict | None = None, timeout: float | None = None) -> int:
    """Run ``argv`` on ``nproc`` ranks and wait; returns torchrun's exit status."""
    return subprocess.run(torchrun_argv(nproc, argv), env=multicast_off_env(env), timeout=timeout).returncode
