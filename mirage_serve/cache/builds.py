"""A cache entry's build: the compiled binaries stored beside its μGraph, and the launch digest.

    build = load_build(cache, key)                  # binaries of a warm, signed entry, or None
    build = build_of(entry, key)                    # the same, from an entry already read
    executor = backends.build(graph, ..., binaries=build.binaries)
    store_build(cache, key, executor.binaries)      # after a successful build

Generated source is never stored or taken from an entry: it is rendered again from the μGraph
(rendering is pure and deterministic), so nothing a cache holds is executed as Python. Binaries
are taken only from an entry signed by this user (``CacheEntry.signed``: the store strips them
from any other), so a cubin planted in a shared cache directory or an archive is never loaded.

The binaries are opaque files from ``superopt.runtime`` (``CompiledGraph.binaries()``: per Triton
kernel its cubin and the metadata JSON Triton needs to load it, and a manifest); this module
does not look inside them. They are specific to the GPU arch and Triton (whose bundled ptxas
compiles them), both of which are in the ``CacheKey`` (``arch``, ``versions_now``), so a binary is only ever found by the toolchain that
built it; shipped entries carry none (``KernelCache.get`` drops them).

When binaries are made: on the GPU, when ``patch`` builds a site (every kernel is compiled at
build time, not at its first launch). The entry holding the μGraph is already written by then
(``optimize.choose`` stores it right after the search), and entries are immutable, so
``store_build`` writes a *new version* of the entry — same μGraph and metadata, plus the
binaries, signed — and installs it atomically in place of the old one, under the key's lock. A reader sees the old version or the new one, never a mix. An entry that already
has binaries is left alone (the first complete build wins, as for searched entries).

``render_digest(graph, launch)``: sha256 of the Triton source the code generator renders for a
μGraph at a launch choice. An entry stores it with the launch its profiler chose; a shipped entry
whose digest no longer matches was profiled on other code, so its μGraph is reused (and verified)
but its launch is profiled again (``mirage_serve.optimize``).

Ahead of time (``mirage-serve warm`` on a machine without the GPU) Triton can build the same
binaries for a named target (``superopt.runtime.binaries.warmup(..., target=)``), but only a
machine with the deployment's Triton and CUDA produces entries under the deployment's key.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from superopt.codegen.launch import Launch, rendering
from superopt.codegen.triton import render_triton
from superopt.ir import KernelGraph

from .files import CacheWarning
from .entry import CacheEntry
from .key import CacheKey
from .store import KernelCache


def render_digest(graph: KernelGraph, launch: dict | None) -> str:
    """sha256 of the Triton module rendered for ``graph`` at ``launch`` (kernel -> ``Launch`` or its
    stored list), without programmatic dependent launch: the digest names the code generator's
    output for the μGraph and its launch choice, whatever the device adds."""
    launch = {k: Launch.of(v) for k, v in (launch or {}).items()}
    module = render_triton(graph, **rendering(launch))
    return hashlib.sha256(module.source.encode()).hexdigest()


@dataclass(frozen=True)
class Build:
    binaries: dict[str, bytes]    # empty when the entry holds none (shipped, imported, unsigned)


def build_of(entry: CacheEntry, key: CacheKey) -> Build:
    """The build stored in `entry` (an entry `cache.get(key)` returned): its binaries if it is
    signed by this user, else none (the caller compiles what it rendered)."""
    return Build(dict(entry.binaries) if entry.signed else {})


def load_build(cache: KernelCache | None, key: CacheKey | None) -> Build | None:
    """The stored build of `key`'s entry (not counted again in `cache.stats`); None if no entry."""
    if cache is None or key is None:
        return None
    entry = cache.get(key, count=False)
    return None if entry is None else build_of(entry, key)


def store_build(cache: KernelCache | None, key: CacheKey | None, binaries: dict[str, bytes]) -> Path | None:
    """Add the build's `binaries` to `key`'s entry; returns the entry's path, or None when nothing
    was written (no entry, nothing to add, already built, read-only)."""
    if cache is None or key is None or not binaries:
        return None
    try:
        return _store(cache, key, binaries)
    except (OSError, ValueError, TimeoutError) as e:  # a build not saved must not fail patch()
        warnings.warn(f"mirage_serve cache: build of {key.dirname()} not saved ({e})", CacheWarning,
                      stacklevel=2)
        return None


def _store(cache: KernelCache, key: CacheKey, binaries: dict[str, bytes]) -> Path | None:
    with cache.lock(key):
        entry = cache.get(key, count=False)
        # Only an entry this user signed gets binaries: signing an unsigned one (shipped, imported)
        # here would launder its metadata, stored verdict included, into a trusted entry; it is
        # signed once it has been verified (optimize.verification_of), and built again then.
        if entry is None or entry.binaries or not entry.signed:
            return None
        new = replace(entry, sources={}, binaries=dict(binaries), origin="")
        return cache.put(key, new, replace_existing=entry.origin == "user")
