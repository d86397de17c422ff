"""Fit the cost model's constants to GPU-measured times, so its ranking follows the profiler's.

The profiler times every candidate the search offers for a program (one *row*); the cost model only
has to order a row's candidates as the GPU does, since those it ranks low may never be offered. The
fit maximises the mean Spearman rank correlation of estimate and measurement over the rows
(``rank_correlation``), by coordinate search over a few constants (``FITTED``), each over a ladder
of multiples of its current value; ties go to the smaller change from the defaults. A row is a list
of (per-node ``cost.features`` of a candidate, measured µs) — plain data, JSON-serialisable, so an
architecture's rows and fitted constants can live in a small file next to a kernel cache
(``save_fit`` / ``cost.load_params``; the caller decides where; superopt never reads a cache).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import replace

from .cost import DEFAULT_PARAMS, CostParams, cost_of, features

# launch_us is left at its measured value (~1–2.5 µs a launch, benchmarks/probe_launch_chain.py): the rank objective
# hardly constrains it (over the 124 shipped entries with timings, 2.5 -> 11.25 µs moved the mean correlation by
# +0.002), and a large one ranks every two-kernel split-K design below the offered ones, the designs that won the
# 8-row down projections of Qwen2.5-0.5B and Llama-3.2-1B (session 46)
FITTED = ("sm_share", "tile_elems", "inflight_bytes", "reread")
LADDER = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)


def rank_correlation(a: list[float], b: list[float]) -> float:
    """Spearman's rho with ties given their mean rank; nan below 2 items or with no spread."""
    def ranks(xs):
        order = sorted(range(len(xs)), key=xs.__getitem__)
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    n = len(a)
    if n < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else float("nan")


def graph_features(g, arch: str = "sm_90") -> list[dict]:
    """``cost.features`` of every node of μGraph ``g`` that costs anything."""
    out = []
    for n in g.nodes:
        f = features(n, [g.type_of(a) for a in n.args], arch)
        if f is not None:
            out.append(f)
    return out


def estimate(feats: list[dict], params: CostParams) -> float:
    return sum(cost_of(f, params) for f in feats)


def row_correlation(row: list, params: CostParams) -> float:
    return rank_correlation([estimate(f, params) for f, _ in row], [us for _, us in row])


def score(rows: list, params: CostParams) -> float:
    """Mean rank correlation over the rows that have one."""
    rhos = [r for r in (row_correlation(row, params) for row in rows) if not math.isnan(r)]
    return sum(rhos) / len(rhos) if rhos else float("nan")


def fit(rows: list, start: CostParams = DEFAULT_PARAMS, rounds: int = 3) -> tuple[CostParams, float, float]:
    """(fitted constants, mean rho before, after) for ``rows`` [[(features, µs), ...], ...]."""
    before = score(rows, start)
    best, best_score = start, before
    for _ in range(rounds):
        changed = False
        for name in FITTED:
            base = getattr(best, name)
            for m in LADDER:
                cand = replace(best, **{name: base * m})
                s = score(rows, cand)
                if s > best_score + 1e-9:
                    best, best_score, changed = cand, s, True
        if not changed:
            break
    return best, before, best_score


def save_fit(path, arch: str, params: CostParams, rows: list, before: float, after: float,
             keep_rows: int = 0) -> None:
    """Write ``params`` for ``arch`` into the JSON file ``path`` (other archs kept), atomically:
    {arch: {"params": {...}, "rows": n, "rho_before": .., "rho_after": ..}}; with ``keep_rows``,
    also the last that many rows (``"kept"``), to refit with the next ones (``kept_rows``)."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            data = {}
    except (FileNotFoundError, ValueError):
        data = {}
    entry = {"params": params.to_json(), "rows": len(rows), "rho_before": round(before, 4),
             "rho_after": round(after, 4)}
    if keep_rows:
        entry["kept"] = [[[[_compact(f) for f in feats], us] for feats, us in row] for row in rows[-keep_rows:]]
    data[arch] = entry
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)


_KEYS = ("bytes", "reread_bytes", "flops", "blocks", "sms", "threads_busy", "largest", "largest_padded",
         "tile_bytes", "resident", "library")


def _compact(f: dict) -> list:
    return [float(f[k]) for k in _KEYS]


def kept_rows(path, arch: str) -> list:
    """The rows ``save_fit(keep_rows=…)`` kept for ``arch`` ([] when none or malformed)."""
    try:
        with open(path) as f:
            kept = json.load(f)[arch]["kept"]
        return [[([_expand(v) for v in feats], float(us)) for feats, us in row] for row in kept]
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return []


def _expand(vals: list) -> dict:
    if len(vals) != len(_KEYS) or not all(isinstance(v, (int, float)) for v in vals):
        raise ValueError("malformed features")
    f = dict(zip(_KEYS, map(float, vals)))
    f["library"] = bool(f["library"])
    return f
