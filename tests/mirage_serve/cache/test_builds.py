"""Entries hold Triton binaries (never generated source: it is rendered again); a warm entry compiles nothing.

On CPU, Triton builds real sm_90 cubins through its JIT's own warm-up path (the driver pointed at
the target), so everything but the launch is checked here: the compile is counted, the binaries
round-trip through an entry, any corrupted file rejects the entry, and a fresh process with an
empty TRITON_CACHE_DIR loads the stored cubins through Triton's cache manager and compiles
nothing. The gpu-marked test checks the same with real launches.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest

from mirage_serve.cache import CacheEntry, CacheWarning, KernelCache
from mirage_serve.cache.builds import load_build, store_build
from mirage_serve.cache.entry import META
from superopt.codegen.triton import render_triton
from superopt.ir import to_text
from superopt.runtime import procs
from tests.mirage_serve.cache._helpers import make_key
from tests.superopt.codegen.triton_cases import build

CASE = "decode_attention_odd"  # two kernels, odd extents
ROOT = Path(__file__).resolve().parents[3]


def _worker(tmp: Path, triton_dir: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp / triton_dir), PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION="1")
    # procs.run: an interrupted test kills the worker's ptxas too, not the worker alone
    r = procs.run([sys.executable, "-m", "tests.mirage_serve.cache._builds_worker", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def aot(tmp_path_factory):
    """(worker result, {file: bytes}, source) of an sm_90 build of CASE in a fresh process."""
    tmp = tmp_path_factory.mktemp("aot")
    res = _worker(tmp, "triton-a", "aot", CASE, str(tmp / "out"))
    files = {p.name: p.read_bytes() for p in (tmp / "out").iterdir() if p.name != "source.py"}
    return res, files, (tmp / "out" / "source.py").read_text()


def _kernels():
    return sorted(k.name for k in render_triton(build(CASE, "bfloat16").ugraph).kernels)


def _text_entry() -> CacheEntry:
    """What optimize.choose stores after a search: the μGraph and metadata, no build."""
    return CacheEntry(to_text(build(CASE, "bfloat16").ugraph), {}, {},
                      {"source": "search", "launch": {"k": [4, 3]}, "median_us": 7.25})


def _warm_cache(tmp_path, aot) -> tuple[KernelCache, object, Path]:
    _, files, source = aot
    cache = KernelCache(tmp_path / "cache", shipped_dir=False)
    key = make_key(7)
    cache.put(key, _text_entry())
    path = store_build(cache, key, files)
    assert path == cache.root / key.dirname()
    return cache, key, path


def test_aot_build_is_counted_and_exported(aot):
    res, files, source = aot
    assert sorted(res["compiled"]) == _kernels() and res["loaded"] == []
    for k in _kernels():  # per kernel: the cubin and Triton's metadata, under its hash
        assert sum(n.startswith(k + ".") and n.endswith(".cubin") for n in files) == 1
        assert sum(n.startswith(k + ".") and n.endswith(".json") for n in files) == 1
    assert "triton-kernels.json" in files
    assert not any(n.endswith((".ptx", ".llir", ".ttir", ".ttgir")) for n in files)  # IR stays out
    cubin = next(v for n, v in files.items() if n.endswith(".cubin"))
    assert cubin[:4] == b"\x7fELF"
    assert source == render_triton(build(CASE, "bfloat16").ugraph).source


def test_build_joins_the_entry_as_a_new_version(tmp_path, aot):
    _, files, source = aot
    cache, key, path = _warm_cache(tmp_path, aot)
    entry = cache.get(key)
    text = _text_entry()
    assert (entry.ugraph_text, entry.meta) == (text.ugraph_text, text.meta)
    assert entry.sources == {} and entry.binaries == files and entry.signed
    listed = json.loads((path / META).read_text())["files"]
    assert set(listed) == {p.name for p in path.iterdir()} - {META}
    assert all(listed[n]["kind"] == "binary" for n in files) and set(listed) == set(files) | {"ugraph.txt"}
    assert [p.name for p in cache.root.iterdir() if p.name.startswith(key.dirname()[:8])] == [path.name]
    # Entries are immutable once built: a second build (another process, other bytes) is ignored.
    assert store_build(cache, key, {n: b"x" for n in files}) is None
    assert cache.get(key).binaries == files
    # load_build is a second look, not a second hit.
    hits = dict(cache.stats.hits)
    assert load_build(cache, key).binaries == files and cache.stats.hits == hits


def test_fresh_process_with_empty_triton_cache_compiles_nothing(tmp_path, aot):
    cache, key, _ = _warm_cache(tmp_path, aot)
    res = _worker(tmp_path, "triton-empty", "load", CASE, str(cache.root), json.dumps(key.fields()))
    assert res["compiled"] == [] and sorted(res["loaded"]) == _kernels()
    assert res["seeded"] == len(_kernels()) and all(res["same_cubin"])


def _flip(p: Path, at: int = 100) -> None:
    b = bytearray(p.read_bytes())
    b[at % len(b)] ^= 0x10
    p.write_bytes(bytes(b))


def _one(path: Path, suffix: str) -> Path:
    return next(p for p in sorted(path.iterdir()) if p.name.endswith(suffix) and p.name != META)


BUILD_CORRUPTIONS = {
    "cubin bit flipped": lambda d: _flip(_one(d, ".cubin"), 777),
    "cubin truncated": lambda d: _one(d, ".cubin").write_bytes(_one(d, ".cubin").read_bytes()[:-9]),
    "cubin deleted": lambda d: _one(d, ".cubin").unlink(),
    "cubin added": lambda d: (d / "evil.0123456789abcdef.cubin").write_bytes(b"\x7fELF"),
    "triton metadata bit flipped": lambda d: _flip(_triton_json(d), 40),
    "manifest edited": lambda d: (d / "triton-kernels.json").write_text('{"format": 1, "kernels": []}'),
    "ugraph bit flipped": lambda d: _flip(d / "ugraph.txt", 60),
}


def _triton_json(d: Path) -> Path:
    return next(p for p in sorted(d.iterdir()) if p.suffix == ".json" and p.name not in (META, "triton-kernels.json"))


@pytest.mark.parametrize("how", sorted(BUILD_CORRUPTIONS))
def test_corrupted_build_file_rejects_the_entry(tmp_path, aot, how):
    cache, key, path = _warm_cache(tmp_path, aot)
    BUILD_CORRUPTIONS[how](path)
    with pytest.warns(CacheWarning, match="ignoring bad entry"):
        assert cache.get(key) is None
    assert load_build(cache, key) is None   # patch() then searches and builds afresh
    assert [i.ok for i in cache.verify()] == [False]


def test_store_build_layers(tmp_path, aot):
    _, files, source = aot
    key = make_key(8)
    # A shipped (text-only, unsigned) hit: no build joins it, since signing it would make its
    # metadata (a stored verdict) believed; optimize.choose verifies it and signs the user entry.
    shipped = KernelCache(tmp_path / "ship", shipped_dir=False)
    shipped.put(key.for_shipped(), _text_entry())
    cache = KernelCache(tmp_path / "user", shipped_dir=tmp_path / "ship")
    assert cache.get(key).origin == "shipped"
    assert store_build(cache, key, files) is None and not (cache.root / key.dirname()).exists()
    cache.put(key, _text_entry())                     # what the verification of the hit writes
    assert store_build(cache, key, files) == cache.root / key.dirname()
    got = cache.get(key)
    assert got.origin == "user" and got.binaries == files and got.signed
    # Read-only: kept in memory for this process, reported as unsaved.
    ro = KernelCache(tmp_path / "ro", shipped_dir=tmp_path / "ship", read_only=True)
    ro.put(key, _text_entry())
    assert store_build(ro, key, files) is None
    assert ro.get(key).binaries == files and ro.stats.unsaved
    # Nothing to store: no entry (a fallback program), or no binaries (CPU, torch backend).
    empty = KernelCache(tmp_path / "empty", shipped_dir=False)
    assert store_build(empty, key, files) is None
    assert store_build(cache, make_key(9), {}) is None


def test_default_cache_opens_from_the_environment(tmp_path, monkeypatch):
    from mirage_serve.patching.pipeline import _open_cache
    from mirage_serve.report import PatchReport

    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", str(tmp_path / "env-cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = _open_cache(None, PatchReport("llama", "torch", "cpu", "float32", (1,)))
    assert cache is not None and cache.root == tmp_path / "env-cache"


@pytest.mark.gpu
def test_warm_entry_compiles_nothing_on_the_gpu(tmp_path):
    """Cold: every kernel compiled at build; warm (fresh process, empty ~/.triton): none, same outputs."""
    cold = _worker(tmp_path, "triton-cold", "gpu", CASE, str(tmp_path / "cold"))
    assert cold["compiles"] == len(_kernels()) and cold["loaded"] == 0 and cold["at_launch"] == []
    files = {p.name: p.read_bytes() for p in (tmp_path / "cold").iterdir() if p.name != "source.py"}
    cache = KernelCache(tmp_path / "cache", shipped_dir=False)
    key = make_key(11)
    cache.put(key, _text_entry())
    assert store_build(cache, key, files)
    warm = _worker(tmp_path, "triton-warm", "gpu", CASE, str(tmp_path / "warm"), str(cache.root),
                   json.dumps(key.fields()))
    assert warm["compiles"] == 0 and warm["loaded"] == len(_kernels()) and warm["at_launch"] == []
    assert warm["outs"] == cold["outs"]


def test_watch_chains_and_restores_the_listener():
    from triton import knobs

    from superopt.runtime.binaries import watch

    seen = []

    def mine(**kw):
        seen.append(kw["cache_hit"])

    before = knobs.compilation.listener
    knobs.compilation.listener = mine
    try:
        with watch([object()]):
            assert knobs.compilation.listener is not mine
            knobs.compilation.listener(src=None, metadata={"hash": "ab"}, metadata_group={}, times=None,
                                       cache_hit=True)  # another kernel: forwarded, not recorded
        assert knobs.compilation.listener is mine and seen == [True]
    finally:
        knobs.compilation.listener = before


@pytest.mark.gpu
def test_patch_with_a_warm_cache_searches_and_compiles_nothing(tmp_path):
    """Issue 7, must-show 2 on a tiny Llama: cold patch fills the cache (μGraphs and binaries); a
    fresh process with an empty ~/.triton then patches with zero searches and zero compiles.
    (Cold compiles happen mostly while profiling candidates, inside optimize; the winner's build
    then loads from Triton's cache, so cold `compiles` may be small.)"""
    cache = str(tmp_path / "cache")
    cold = _worker(tmp_path, "triton-cold", "patch", cache)
    print(cold["report"])
    assert cold["unpatched"] == 0 and cold["searches"] + cold["reinstantiated"] > 0
    warm = _worker(tmp_path, "triton-warm", "patch", cache)
    print(warm["report"])
    assert warm["unpatched"] == 0 and warm["searches"] == 0 and warm["reinstantiated"] == 0
    assert warm["compiles"] == 0, warm["report"]
    assert warm["cache_hits"] == cold["searches"] + cold["reinstantiated"]
    # (tokens are not compared: kernels with atomic cross-block sums are not bitwise deterministic)
    assert any(i.binaries for i in KernelCache(cache, shipped_dir=False).ls(("user",)))

