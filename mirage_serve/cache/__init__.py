"""The kernel cache: a user cache of searched, compiled kernels layered over the shipped one.

    cache = KernelCache()                      # argument > MIRAGE_SERVE_CACHE_DIR > ~/.cache/mirage_serve
    key = CacheKey(program_digest, "b8", "bf16", "sm90", "triton", versions_now(), "rmsnorm_matmul-…")
    with cache.lock(key):                      # concurrent processes compute each kernel once
        entry = cache.get(key)                 # None on a miss or a rejected (bad) entry
        if entry is None or not entry.binaries:
            entry = build(...)                 # search / compile
            cache.put(key, entry)              # atomic; None if the cache is read-only

Trust: `put` signs entries with a per-user secret (`trust.py`); `get` returns binaries and a
believable verdict only from entries this user signed. Shipped, imported or foreign entries come
back as μGraph text, which `mirage_serve.optimize` verifies against the site's program before use
(docs/architecture.md, "Cache trust"). `audit.audit` is `mirage-serve cache verify`.

`mirage_serve.cache.warm.warm_model` fills a cache ahead of time (a front end above patch(), not
re-exported here: the store below imports nothing of the patch machinery).
"""
from .entry import BadEntry, CacheEntry
from .key import CacheKey, versions_now
from .files import CacheWarning
from .store import CacheStats, EntryInfo, KernelCache, default_cache_dir, shipped_cache_dir

__all__ = [
    "BadEntry", "CacheEntry", "CacheKey", "CacheStats", "CacheWarning", "EntryInfo", "KernelCache",
    "default_cache_dir", "shipped_cache_dir", "versions_now",
]
