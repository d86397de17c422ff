"""Several processes on one cache: one build and one entry per key, whole entries only, and a
writer killed mid-entry leaves nothing visible."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import warnings

import pytest

from mirage_serve.cache import KernelCache

from . import _helpers
from ._helpers import make_entry, make_key

KEYS = [0, 1, 2, 3, 4, 5]


def test_four_patchers_build_each_key_once(tmp_path):
    ctx = mp.get_context("spawn")
    log = tmp_path / "builds.log"
    with ctx.Pool(4) as pool:
        # Each process walks the keys in its own order, so processes collide on every key.
        orders = [KEYS, KEYS[::-1], KEYS[2:] + KEYS[:2], KEYS[3:] + KEYS[:3]]
        results = pool.starmap(_helpers.patcher,
                               [(str(tmp_path / "cache"), order, str(log), str(tmp_path / "gate"))
                                for order in orders])
    builds = [line.split()[1] for line in log.read_text().splitlines()]
    assert sorted(builds) == sorted(str(k) for k in KEYS), builds     # exactly one build per key
    # Every process saw the same content for every key.
    by_key = [dict(zip(order, got)) for order, got in zip(orders, results)]
    assert all(d == by_key[0] for d in by_key)
    cache = KernelCache(tmp_path / "cache", shipped_dir=False)
    rows = cache.verify()
    assert len(rows) == len(KEYS) and all(r.ok for r in rows)
    assert all(cache.get(make_key(k)) == make_entry(k) for k in KEYS)
    assert not any((tmp_path / "cache" / ".tmp").iterdir())


def test_unlocked_concurrent_puts_leave_one_whole_entry_per_key(tmp_path):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.starmap(_helpers.unlocked_putter, [(str(tmp_path / "c"), KEYS, str(tmp_path / "gate"))] * 4)
    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    entries = [p for p in (tmp_path / "c").iterdir() if not p.name.startswith((".", "CACHEDIR"))]
    assert len(entries) == len(KEYS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all(cache.get(make_key(k)) == make_entry(k) for k in KEYS)
    assert not any((tmp_path / "c" / ".tmp").iterdir())


def test_killed_writer_leaves_no_partial_entry(tmp_path):
    ctx = mp.get_context("spawn")
    started = tmp_path / "started"
    proc = ctx.Process(target=_helpers.slow_writer, args=(str(tmp_path / "c"), str(started)))
    proc.start()
    deadline = time.time() + 60
    while not started.exists():
        assert proc.is_alive() and time.time() < deadline, "writer never started writing"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    # The writer's files exist, but only in its private temp directory.
    assert list((tmp_path / "c" / ".tmp").glob("*/ugraph.txt"))
    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    key = make_key(7)
    assert not (tmp_path / "c" / key.dirname()).exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # a clean miss: nothing half-written to reject
        assert cache.get(key) is None
        assert cache.ls() == []
        cache.put(key, make_entry(7))
        assert cache.get(key) == make_entry(7)
    assert cache.clear() == 1 and not (tmp_path / "c" / ".tmp").exists()


@pytest.mark.slow
def test_four_processes_patching_one_model_share_one_cache(tmp_path):
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_helpers.real_patcher, [(str(tmp_path / "c"), str(tmp_path / "gate"))] * 4)
    rows = KernelCache(tmp_path / "c", shipped_dir=False).verify(layers=("user",))
    assert rows and all(r.ok for r in rows)
    assert len({r.key.digest() for r in rows}) == len(rows)
    assert all(r["logits"] == results[0]["logits"] for r in results)
    # The lock makes every program be searched once in all: the others hit the cache.
    assert sum(r["searches"] for r in results) == len(rows), [r["searches"] for r in results]
    assert sum(r["cache_hits"] for r in results) == 3 * len(rows)
