"""Static KV caches owned by a patched model: one per batch size, reused across generate() calls.

HF's ``StaticCache`` keeps the written length on the device (``cumulative_length``), so a decode
step needs no host sync and can be replayed from a CUDA graph. Owning the cache (instead of letting
generate() make a new one per call) keeps the captured graphs valid across calls: their addresses
are the cache's tensors.
"""
from __future__ import annotations

import logging

import torch
from transformers import StaticCache

log = logging.getLogger("mirage_serve")

# Cache lengths are rounded up to this many tokens: decode attention reads the whole static cache
# every step, so a cache far longer than the request costs bandwidth; a little slack avoids a new
# cache (and new graphs) for every small change in prompt length.
LENGTH_QUANTUM = 256


class CachePool:
    def __init__(self, config):
        self.config = config
        # batch -> (cache, its length); the length is kept here because the Cache API to read
        # it differs between transformers releases.
        self._caches: dict[int, tuple[StaticCache, int]] = {}

    def owns(self, cache) -> bool:
        return any(cache is c for c, _ in self._caches.values())

    def length(self, cache) -> int:
        """The token count ``cache`` was made for (its sliding-window layers hold fewer)."""
        return next(n for c, n in self._caches.values() if c is cache)

    def get(self, batch: int, needed_len: int) -> tuple[StaticCache, bool]:
        """A reset cache for ``batch`` rows holding ≥ ``needed_len`` tokens; True if newly made."""
        cache, have = self._caches.get(batch, (None, 0))
        if cache is not None and have >= needed_len and not _frozen_here(cache):
            cache.reset()
            return cache, False
        length = -(-needed_len // LENGTH_QUANTUM) * LENGTH_QUANTUM
        if cache is not None:
            log.info("mirage_serve: static KV cache for batch %d grown from %d to %d tokens "
                     "(decode graphs for it are captured again)", batch, have, length)
        cache = StaticCache(config=self.config, max_cache_len=length)
        self._caches[batch] = (cache, length)
        return cache, True

    def clear(self) -> None:
        self._caches.clear()


def _frozen_here(cache) -> bool:
    """True if the cache's tensors were made under ``torch.inference_mode`` and we are outside it.

    StaticCache allocates lazily, inside the first forward: a first generate() under
    inference_mode leaves inference tensors that no later call outside it may reset or update.
    """
    if torch.is_inference_mode_enabled():
        return False
    return any(getattr(layer, "is_initialized", False) and layer.keys.is_inference()
               for layer in cache.layers)
