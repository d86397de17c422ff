"""The kernel cache: a user cache of searched, compiled kernels layered over the shipped one.

    cache = KernelCache()                      # argument > MIRAGE_SERVE_CACHE_DIR > ~/.cache/mirage_serve
    key = CacheKey(program_digest, "b8", "bf16", "sm90", "triton", versions_now(), "rmsnorm_matmul-…")
    with cache.lock(key):                      # concurrent processes compute each kernel once
        entry = cache.get(key)                 # None on a miss or a rejected (bad) entry
        if entry is None or not entry.binaries:
            entry = build(...)                 # search / compile
            cache.put(key, entry)              # atomic; None if the cache is read-only

`mirage_serve.cache.warm.warm_model` fills a cache ahead of time (a front end above patch(), not
re-exported here: the store below imports nothing of the patch machinery).
"""
from .entry import BadEntry, CacheEntry
from .key import CacheKey, versions_now
from .store import CacheStats, CacheWarning, EntryInfo, KernelCache, default_cache_dir, shipped_cache_dir

__all__ = [
    "BadEntry", "CacheEntry", "CacheKey", "CacheStats", "CacheWarning", "EntryInfo", "KernelCache",
    "default_cache_dir", "shipped_cache_dir", "versions_now",
]
