"""The search checkpoint: an append-only JSONL file of pattern results and found μGraphs.

Line kinds: ``header`` (program digest, budget, seed), ``pattern`` (one tiling pattern's designs and
stats, written as soon as its search ends) and ``found`` (a verified μGraph's text and cost). A
killed search keeps every line it flushed; a new search with the same file skips the patterns
already recorded for the same program and budget. Lines that do not parse (a torn last write)
are ignored.
"""
from __future__ import annotations

import json
import os

from .skeleton import design_from_json, design_to_json


class Checkpoint:
    def __init__(self, path: str | os.PathLike | None, program_digest: str, budget_log: dict, seed: int):
        self.path = path
        # through JSON once, so the tuples of the budget compare equal to what a file holds
        self.key = json.loads(json.dumps({"program": program_digest, "budget": budget_log, "seed": seed}))
        self.patterns: dict[str, tuple[list, dict]] = {}
        if path is None:
            return
        current = False
        if os.path.exists(path) and os.path.getsize(path):
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:  # a write cut off by a kill: end that line so the next record stands alone
                with open(path, "a") as f:
                    f.write("\n")
            with open(path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if rec.get("kind") == "header":
                        current = all(rec.get(k) == v for k, v in self.key.items())
                    elif rec.get("kind") == "pattern" and current:
                        self.patterns[rec["key"]] = ([design_from_json(d) for d in rec["designs"]], rec["stats"])
        self._write({"kind": "header", **self.key})

    def _write(self, rec: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def record_pattern(self, key: str, designs: list, stats: dict) -> None:
        self._write({"kind": "pattern", "key": key, "designs": [design_to_json(d) for d in designs],
                     "stats": stats})

    def record_found(self, text: str, cost: float) -> None:
        self._write({"kind": "found", "cost_us": cost, "graph": text})
