"""A table benchmark that outlives a launch that breaks its CUDA context.

After an illegal address every later CUDA call of the process fails, so one bad candidate used to
end a ``bench_blocks.py`` run: its row and every row after it read "not run" (GQA b8, sessions 30
and 31). The profiler names such a launch (``superopt.runtime.profile.ContextLost``); the benchmark
then records it in a JSON file of refused launches, and runs itself again in a fresh process
(``os.execv``, same arguments plus ``--resume``), which refuses those launches
(``Selector.refuse``), keeps the rows its output file already has, and runs the rest.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from superopt.codegen.launch import Launch

MAX_RESTARTS = 4  # a row that keeps breaking contexts after this many is reported failed


def load_refused(path: str) -> list[tuple[str, Launch | None]]:
    """The launches ``save_refused`` recorded in ``path`` (none when the file is absent)."""
    p = Path(path)
    if not path or not p.exists():
        return []
    return [(text, None if stored is None else Launch.of(stored)) for text, stored in json.loads(p.read_text())]


def save_refused(path: str, key: tuple[str, Launch | None]) -> None:
    """Add the launch ``key`` (``profile.launch_key``: μGraph text, launch or None) to ``path``."""
    keys = load_refused(path) + [key]
    Path(path).write_text(json.dumps([[text, None if c is None else c.stored()] for text, c in keys], indent=1))


def finished_rows(lines: list[str]) -> set[tuple[str, str]]:
    """(label, dtype) of the table rows in ``lines`` that have a result or a failure, not "not run"."""
    out = set()
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[0] != "row" and not cells[2].startswith("not run"):
            out.add((cells[0], cells[1]))
    return out


def restart(argv: list[str], refused: str, restarts: int, seconds_left: float) -> None:
    """Run this benchmark again in a fresh process (never returns): ``argv`` (``sys.argv``) with
    ``--resume``, the refused-launch file, the restart count, and the time left as its deadline and
    compile budget (both count from a process's start). They are appended: argparse keeps the last
    value of an option given twice, so an earlier restart's or the caller's are overridden."""
    left = f"{max(seconds_left, 0):.0f}"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *argv, "--resume", "--refused", refused, "--restarts",
                              str(restarts + 1), "--deadline-s", left, "--compile-budget-s", left])
