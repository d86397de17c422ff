"""A cache entry's build: the generated source and compiled binaries stored beside its μGraph.

    build = load_build(cache, key)                  # (source, binaries) of a warm entry, or None
    build = build_of(entry, key)                    # the same, from an entry already read
    executor = backends.build(graph, ..., source=build.source, binaries=build.binaries)
    store_build(cache, key, executor.source, executor.binaries)   # after a successful build

The binaries are opaque files from ``superopt.runtime`` (``CompiledGraph.binaries()``: per Triton
kernel its cubin and the metadata JSON Triton needs to load it, and a manifest); this module
does not look inside them. They are specific to (GPU arch, Triton, CUDA), all of which are in the
``CacheKey`` (``arch``, ``versions_now``), so a binary is only ever found by the toolchain that
built it; shipped entries carry none (``KernelCache.get`` drops them).

When binaries are made: on the GPU, when ``patch`` builds a site (every kernel is compiled at
build time, not at its first launch). The entry holding the μGraph is already written by then
(``optimize.choose`` stores it right after the search), and entries are immutable, so
``store_build`` writes a *new version* of the entry — same μGraph and metadata, plus
``source.py`` and the binaries — and installs it atomically in place of the old one, under the
key's lock. A reader sees the old version or the new one, never a mix. An entry that already
has binaries is left alone (the first complete build wins, as for searched entries).

Ahead of time (``mirage-serve warm`` on a machine without the GPU) Triton can build the same
binaries for a named target (``superopt.runtime.binaries.warmup(..., target=)``), but only a
machine with the deployment's Triton and CUDA produces entries under the deployment's key.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from .entry import CacheEntry
from .key import CacheKey
from .store import CacheWarning, KernelCache

SOURCE = "source.py"   # the generated Triton module
SOURCE_CUDA = "source.cu"   # the generated CUDA C++ module (backend "cuda")


def source_name(key: CacheKey) -> str:
    return SOURCE_CUDA if key.backend == "cuda" else SOURCE


@dataclass(frozen=True)
class Build:
    source: str | None            # generated source, as stored (sha256-checked on read)
    binaries: dict[str, bytes]    # empty when the entry holds none (shipped, text-only)


def build_of(entry: CacheEntry, key: CacheKey) -> Build:
    """The build stored in `entry` (an entry `cache.get(key)` returned). Its source comes only with
    its binaries (what they were built from): without binaries (a shipped entry) the μGraph is
    rendered by the current code generator, not compiled from an older one's stored text."""
    if not entry.binaries:
        return Build(None, {})
    return Build(entry.sources.get(source_name(key)), dict(entry.binaries))


def load_build(cache: KernelCache | None, key: CacheKey | None) -> Build | None:
    """The stored build of `key`'s entry (not counted again in `cache.stats`); None if no entry."""
    if cache is None or key is None:
        return None
    entry = cache.get(key, count=False)
    return None if entry is None else build_of(entry, key)


def store_build(cache: KernelCache | None, key: CacheKey | None, source: str | None,
                binaries: dict[str, bytes]) -> Path | None:
    """Add the build (generated `source`, `binaries`) to `key`'s entry; returns the entry's path,
    or None when nothing was written (no entry, nothing to add, already built, read-only)."""
    if cache is None or key is None or not binaries:
        return None
    try:
        return _store(cache, key, source, binaries)
    except (OSError, ValueError, TimeoutError) as e:  # a build not saved must not fail patch()
        warnings.warn(f"mirage_serve cache: build of {key.dirname()} not saved ({e})", CacheWarning,
                      stacklevel=2)
        return None


def _store(cache: KernelCache, key: CacheKey, source: str | None, binaries: dict[str, bytes]) -> Path | None:
    with cache.lock(key):
        entry = cache.get(key, count=False)
        if entry is None or entry.binaries:
            return None
        sources = dict(entry.sources)
        if source is not None:
            sources[source_name(key)] = source
        new = replace(entry, sources=sources, binaries=dict(binaries), origin="")
        # A shipped (text-only) hit has no user entry yet: this writes the first one.
        return cache.put(key, new, replace_existing=entry.origin == "user")
