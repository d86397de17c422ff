"""Shipped launch choices that the code generator has moved on from (docs/architecture.md, "Launches per GPU").

An entry's launch, and each GPU's row of it, stores the digest of the Triton source it was timed on
(``render_sha256``, ``builds.render_digest``). Once the renderer writes other source for that μGraph, the launch is
*stale*. patch() keeps the μGraph but times its launches again on a user's first patch (``mirage_serve.optimize``).
That cost a first patch of Llama-3.1-8B 21.4 s for one entry on an H200 (session 46). ``stale_launches`` lists every
such launch in a folder of entries, so that a renderer change can be followed by re-timing on the GPUs it names
(``benchmarks/shipped_coverage.py`` names them per model, with the command).
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from superopt.ir import check, from_text

from .builds import render_digest
from .entry import BadEntry, read_entry
from .key import CacheKey

DEFAULT = "default"   # the entry's own launch (its ``timed_on`` names its GPU, where known); else a GPU row's name


class StaleLaunch(NamedTuple):
    entry: str        # the entry's folder name
    row: str          # DEFAULT, or the GPU name of a ``launch_by_gpu`` row
    key: CacheKey


def stale_launches(folder: Path) -> list[StaleLaunch]:
    """Every stored Triton launch under ``folder`` whose ``render_sha256`` is not the digest of what the renderer
    writes for it now. Entries that do not load are skipped: ``mirage-serve cache verify`` reports those."""
    out = []
    for path in sorted(p for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            key, entry = read_entry(path)
        except BadEntry:
            continue
        if key.backend != "triton":
            continue
        graph = check(from_text(entry.ugraph_text))
        rows = [(DEFAULT, entry.meta)] + sorted((entry.meta.get("launch_by_gpu") or {}).items())
        for name, row in rows:
            if "launch" in row and row.get("render_sha256") != render_digest(graph, row["launch"]):
                out.append(StaleLaunch(path.name, name, key))
    return out
