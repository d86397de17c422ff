"""The cost model's constants, fitted to what patch()'s GPU profiler measured, kept per arch in the cache.

The profiler (``patching.prepare``) times every candidate a search offers for a program; ``record``
adds that row — each candidate's cost-model features and its measured µs — to ``<cache
root>/cost_fit.json`` and refits the arch's constants (``superopt.search.fit``: the mean rank
correlation of estimate and measurement over the rows); ``params`` reads them back, and patch()
searches with them (``SearchBudget(cost_params=…)``) where it profiles. The file holds numbers
only ({arch: {"params": {...}, "kept": the last ``MAX_ROWS`` rows, ...}}): nothing in it runs, a
malformed one is ignored and rewritten, and the worst a foreign one can do is reorder the verified
candidates the profiler then times anyway.

The shipped cache holds such a file too (``kernels_cache/cost_fit.json``). It is fitted to the profiler timings that
the shipped entries keep (``benchmarks/cost_vs_measured.py --fit``), so a user whose own patches have profiled
nothing yet searches with the GPU's ordering rather than the hand-set constants. Their first profile refits, starting
from the shipped file's kept rows.
"""
from __future__ import annotations

import math

FILE = "cost_fit.json"
MAX_ROWS = 32   # rows kept to refit with: the last programs profiled on this arch


def params(cache, arch: str):
    """The ``CostParams`` fitted for ``arch`` in ``cache`` (a ``KernelCache``): this user's, else the shipped
    cache's, else None (the hand-set constants)."""
    if cache is None:
        return None
    from superopt.search.cost import load_params
    for folder in (cache.root, cache.shipped):
        try:
            fitted = load_params(folder / FILE, arch) if folder is not None else None
        except (ValueError, TypeError, OSError):
            fitted = None
        if fitted is not None:
            return fitted
    return None


def record(cache, arch: str, ranked) -> None:
    """Add one profiled program's timings (``ProfileResult``s) for ``arch`` and refit; a cache that
    cannot be written, or fewer than 3 timed candidates, changes nothing."""
    if cache is None or getattr(cache, "read_only", True):
        return
    from superopt.search.fit import fit, graph_features, kept_rows, save_fit
    row = [(graph_features(r.ugraph, arch), float(r.median_us)) for r in ranked
           if r.error is None and math.isfinite(r.median_us)]
    if len(row) < 3:
        return
    path = cache.root / FILE
    kept = kept_rows(path, arch) or (kept_rows(cache.shipped / FILE, arch) if cache.shipped is not None else [])
    rows = (kept + [row])[-MAX_ROWS:]
    fitted, before, after = fit(rows)
    try:
        save_fit(path, arch, fitted, rows, before, after, keep_rows=MAX_ROWS)
    except OSError:
        return
