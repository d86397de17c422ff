"""Run a script in Triton's CPU interpreter, in a process of its own, and read back the one JSON line it prints last.

TRITON_INTERPRET must be set before triton is imported, and a pytest process that set it would interpret every
later test's kernels, so each interpreter run is a child process of the repository root.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(*args: str, timeout: float = 600):
    """``python *args`` (e.g. ``"-m", "tests.superopt.codegen.triton_interp_run"``) with TRITON_INTERPRET=1;
    its exit status checked, its last stdout line parsed as JSON."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
