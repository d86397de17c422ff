"""Launch choices per GPU model in one cache entry (docs/cache.md, "Launches per GPU").

A cache key names the arch (sm90), and one arch holds several GPUs whose best launch for the same
μGraph differs: Llama-3.1-8B's 8-row down projection ran 34.8 µs a call on an H200 with the launch an
H100 had chosen (2 warps, 3 stages), 29.6 µs with the one timed on the H200 (4 warps, 4 stages). So an
entry's metadata says which GPU timed its launch (``timed_on``), and may carry other GPUs' choices as
rows: ``launch_by_gpu = {gpu name: {launch, median_us, profile, render_sha256}}``.

- ``for_gpu`` is what a patch reads: the entry's metadata with this GPU's row in place of the default.
- ``with_row`` is what shipping a warm cache does (``benchmarks/ship_entries.py``): an entry timed on
  one GPU becomes that GPU's row of the shipped entry, whose default stays as it was.
"""
from __future__ import annotations

# what a row replaces of the entry's metadata; the μGraph, its verdict and the rest stay the entry's
ROW_FIELDS = ("launch", "median_us", "profile", "render_sha256")


def for_gpu(meta: dict, gpu: str) -> dict:
    """``meta`` with ``gpu``'s row, if it has one, as its launch (and ``timed_on`` then ``gpu``)."""
    rows = meta.get("launch_by_gpu")
    row = rows.get(gpu) if gpu and isinstance(rows, dict) else None
    if not isinstance(row, dict) or meta.get("timed_on") == gpu:
        return meta
    out = {k: v for k, v in meta.items() if k not in ROW_FIELDS and k != "timings"}  # timings: the default's
    out.update({k: row[k] for k in ROW_FIELDS if k in row}, timed_on=gpu)
    return out


def timed_elsewhere(meta: dict, gpu: str) -> bool:
    """Whether the launch ``meta`` holds (after ``for_gpu``) was not timed on ``gpu``: an entry from before
    ``timed_on`` was recorded counts as timed elsewhere."""
    return bool(gpu) and meta.get("timed_on") != gpu


def with_row(shipped: dict, timed: dict) -> dict:
    """The shipped entry's metadata ``shipped`` with the launch of ``timed`` (an entry of the same μGraph,
    timed on the GPU its ``timed_on`` names) as that GPU's row. Where the shipped default was timed on that
    same GPU, the default itself is replaced and no row is kept for it."""
    gpu = timed.get("timed_on")
    if not gpu or "launch" not in timed:
        raise ValueError("the timed entry names no GPU (timed_on) or holds no launch: nothing to add")
    row = {k: timed[k] for k in ROW_FIELDS if k in timed}
    rows = {g: r for g, r in (shipped.get("launch_by_gpu") or {}).items() if g != gpu}
    out = {k: v for k, v in shipped.items() if k != "launch_by_gpu"}
    if shipped.get("timed_on") == gpu:
        for k in ROW_FIELDS:
            out.pop(k, None)
        out.update(row)
        if "timings" in timed:
            out["timings"] = timed["timings"]
    else:
        rows[gpu] = row
    if rows:
        out["launch_by_gpu"] = dict(sorted(rows.items()))
    return out
