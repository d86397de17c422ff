"""Choose and verify the μGraph for a Lax program: cache, then search, else the program itself.

The one place patch() meets the superoptimizer, so swapping the search or the verifier in or out
touches this file only. A Lax program is itself a valid μGraph (library kernels, one launch per
op), so when no search is installed, or it finds nothing, the program runs as it is; it is then
trivially equivalent to itself.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from superopt.ir import KernelGraph, digest, from_text, to_text


@dataclass(frozen=True)
class Choice:
    graph: KernelGraph
    source: str        # "cache", "search" or "fallback"
    note: str          # why, for the report
    seconds: float


@dataclass(frozen=True)
class Verification:
    ok: bool
    verdict: str
    seconds: float


def search_available() -> bool:
    try:
        from superopt.search import superoptimize  # noqa: F401
    except ImportError:
        return False
    return True


def choose(program: KernelGraph, *, budget, arch: str, cache=None, key=None) -> Choice:
    """The μGraph to run for ``program``. ``budget=0`` skips the search (tests, quick starts).

    ``cache`` is a ``mirage_serve.cache.KernelCache`` and ``key`` its ``CacheKey`` for this program,
    or both None; only searched winners are stored (the fallback is the program itself).
    """
    if cache is None or key is None:
        return _choose(program, budget, arch, None, None)
    # Concurrent patchers of one model: one searches each program, the others wait, then hit.
    with cache.lock(key):
        return _choose(program, budget, arch, cache, key)


def _choose(program: KernelGraph, budget, arch: str, cache, key) -> Choice:
    t0 = time.perf_counter()
    if cache is not None and key is not None:
        entry = cache.get(key)
        if entry is not None:
            return Choice(from_text(entry.ugraph_text), "cache", f"cache entry {key.dirname()}",
                          time.perf_counter() - t0)
    if budget == 0:
        return Choice(program, "fallback", "search disabled (search_budget=0)", time.perf_counter() - t0)
    try:
        from superopt.search import superoptimize
    except ImportError:
        return Choice(program, "fallback", "superopt.search is not installed", time.perf_counter() - t0)
    kwargs = {"arch": arch} if budget is None else {"arch": arch, "budget": budget}
    try:
        result = superoptimize(program, **kwargs)
    except Exception as e:  # a search failure must not stop the patch: the program still runs
        return Choice(program, "fallback", f"search failed: {type(e).__name__}: {e}",
                      time.perf_counter() - t0)
    best = getattr(result, "best", None)
    if best is None:
        return Choice(program, "fallback", "search found no μGraph", time.perf_counter() - t0)
    if cache is not None and key is not None:
        from .cache import CacheEntry
        cache.put(key, CacheEntry(to_text(best), {}, {}, {"program_digest": digest(program)}))
    return Choice(best, "search", f"searched ({time.perf_counter() - t0:.1f} s)", time.perf_counter() - t0)


def verify(program: KernelGraph, ugraph: KernelGraph) -> Verification:
    """Finite-field equivalence of ``ugraph`` to ``program`` (trivial when they are one graph)."""
    t0 = time.perf_counter()
    if ugraph == program:
        return Verification(True, "identical (the μGraph is the program)", time.perf_counter() - t0)
    try:
        from superopt.verify import check_equivalent
    except ImportError:
        return Verification(False, "not verified: superopt.verify.check_equivalent is not installed",
                            time.perf_counter() - t0)
    v = check_equivalent(program, ugraph)
    ok = bool(getattr(v, "equivalent", v))
    return Verification(ok, str(v), time.perf_counter() - t0)
