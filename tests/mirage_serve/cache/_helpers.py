"""Shared builders for the cache tests: random keys and entries, and spawn-process workers.

Workers live here (an importable module) because multiprocessing's spawn start method pickles
functions by module and name.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

from mirage_serve.cache import CacheEntry, CacheKey, KernelCache
from mirage_serve.cache import entry as entry_mod

# A tiny Llama with odd sizes (hidden 96, intermediate 136, vocab 73) for patch()/warm tests.
TINY = {"model_type": "llama", "hidden_size": 96, "intermediate_size": 136, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 73, "head_dim": 24,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}

VERSIONS = (("superopt", "0.1.0"), ("triton", "3.6.0"), ("torch", "2.11.0+cu130"),
            ("cuda-nvrtc", "13.0.48"))


def make_key(i: int = 0, versions=VERSIONS, label: str = "rmsnorm_matmul-sm90-bf16-k896-n73") -> CacheKey:
    return CacheKey(f"{i:04d}" + "c0ffee" * 2, f"b{3 + i}", "bf16", "sm90", "triton", versions,
                    f"{label}-{i}")


def make_entry(seed: int = 0) -> CacheEntry:
    """A non-trivial entry: odd-sized random binary, unicode source, nested float metadata."""
    rng = random.Random(seed)
    binary = bytes(rng.randrange(256) for _ in range(4099 + seed))
    src = f"# kernel {seed} — μGraph fused\n" + "".join(f"x{j} = {rng.random()!r}\n" for j in range(50))
    return CacheEntry(
        ugraph_text=f"graph g{seed}\ninput %x : bfloat16[3,896]\noutput %x\n",
        sources={"kernel.py": src, "launch.cu": "// launch\n"},
        binaries={"kernel.cubin": binary},
        meta={"timings_us": [rng.random() for _ in range(5)], "verdict": {"trials": 8, "ok": True},
              "created": "2026-11-22T02:00:00Z"},
    )


def barrier(folder: str, parties: int, timeout: float = 300.0) -> None:
    """Wait until `parties` processes have arrived, so they really race (a file per arrival)."""
    Path(folder).mkdir(exist_ok=True)
    Path(folder, f"ready-{os.getpid()}").touch()
    deadline = time.time() + timeout
    while len(list(Path(folder).glob("ready-*"))) < parties:
        if time.time() > deadline:
            raise TimeoutError(f"only {len(list(Path(folder).glob('ready-*')))} of {parties} arrived")
        time.sleep(0.002)


def patcher(cache_dir: str, keys: list[int], log: str, gate: str) -> list[str]:
    """One 'patching' process: for each key, look up under the lock, build on a miss, put.
    Each build appends a line to `log` (O_APPEND), so the test can count builds."""
    barrier(gate, 4)
    cache = KernelCache(cache_dir, shipped_dir=False)
    got = []
    for i in keys:
        key = make_key(i)
        with cache.lock(key):
            e = cache.get(key)
            if e is None:
                time.sleep(0.02)          # a build takes time: a racing process must wait for it
                with open(log, "a") as f:
                    f.write(f"{os.getpid()} {i}\n")
                e = make_entry(i)
                cache.put(key, e)
        got.append(e.binaries["kernel.cubin"].hex()[:64] + e.sources["kernel.py"][-40:])
    return got


def unlocked_putter(cache_dir: str, keys: list[int], gate: str) -> int:
    """Put every key without taking the lock: atomic install alone must keep entries whole."""
    barrier(gate, 4)
    cache = KernelCache(cache_dir, shipped_dir=False)
    for i in keys:
        cache.put(make_key(i), make_entry(i))
    return os.getpid()


def slow_writer(cache_dir: str, started: str) -> None:
    """Write one entry, pausing between files; signals `started` after the first file."""
    def pause():
        Path(started).touch()
        time.sleep(30)
    entry_mod.between_files = pause
    KernelCache(cache_dir, shipped_dir=False).put(make_key(7), make_entry(7))


def real_patcher(cache_dir: str, gate: str) -> dict:
    """Build the tiny Llama (same seed everywhere), patch it into `cache_dir`, run one forward."""
    import torch

    import mirage_serve
    from mirage_serve.cache.warm import build_model, resolve_config

    torch.manual_seed(0)
    # One layer, one bucket: four programs (attention in/out, MLP in/out), searched once each.
    model = build_model(resolve_config({**TINY, "num_hidden_layers": 1})[1], "fp32", "cpu")
    barrier(gate, 4)
    report = mirage_serve.patch(model, backend="torch", cache_dir=cache_dir, batch_sizes=(3,))
    ids = torch.randint(0, TINY["vocab_size"], (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids).logits          # [3, 5, 73]
    return {"searches": report.searches, "cache_hits": report.cache_hits,
            "logits": logits.numpy().tobytes()}
