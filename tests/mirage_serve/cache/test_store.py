"""KernelCache: round trip, rejection and rebuild of bad entries, version misses, read-only
caches, the shipped layer, maintenance commands and default directory resolution."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from mirage_serve.cache import CacheKey, CacheWarning, KernelCache, default_cache_dir
from mirage_serve.cache.entry import META

from ._helpers import VERSIONS, make_entry, make_key


@pytest.fixture
def cache(tmp_path):
    return KernelCache(tmp_path / "user", shipped_dir=False)


def _no_warnings():
    return warnings.catch_warnings(record=True, action="always")


def test_round_trip_is_exact(cache):
    key, e = make_key(1), make_entry(1)
    assert cache.get(key) is None
    path = cache.put(key, e)
    assert path == cache.root / key.dirname() and path.name.startswith("rmsnorm_matmul-sm90-bf16")
    got = cache.get(key)
    assert got == e and got.origin == "user"
    assert got.binaries["kernel.cubin"] == e.binaries["kernel.cubin"]
    assert cache.stats.hits["user"] == 1 and cache.stats.misses == 1 and cache.stats.puts == 1
    # Plain files only: JSON, text and raw bytes.
    assert sorted(p.name for p in path.iterdir()) == ["kernel.cubin", "kernel.py", "launch.cu",
                                                     "meta.json", "ugraph.txt"]
    doc = json.loads((path / META).read_text())
    assert doc["key"]["bucket"] == key.bucket and doc["files"]["kernel.cubin"]["bytes"] == 4100


def _flip(p: Path, at: int) -> None:
    b = bytearray(p.read_bytes())
    b[at] ^= 0x10
    p.write_bytes(bytes(b))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _edit_meta(fn):
    def edit(d: Path) -> None:
        doc = json.loads((d / META).read_text())
        fn(doc)
        (d / META).write_text(json.dumps(doc, sort_keys=True, indent=1))
    return edit


def _set_timing(doc):
    doc["meta"]["timings_us"][0] = 0.001


def _set_version(doc):
    doc["key"]["versions"][1][1] = "9.9.9"


def _set_file_hash(doc):
    doc["files"]["kernel.py"]["sha256"] = "0" * 64


def _drop_self_hash_and_edit(doc):
    # An editor who also recomputes nothing: dropping self_sha256 must not make it trusted.
    del doc["self_sha256"]
    doc["meta"]["verdict"]["ok"] = False


CORRUPTIONS = {
    "binary truncated": lambda d: _truncate(d / "kernel.cubin"),
    "binary bit flipped": lambda d: _flip(d / "kernel.cubin", 2049),
    "source bit flipped": lambda d: _flip(d / "kernel.py", 17),
    "ugraph truncated": lambda d: _truncate(d / "ugraph.txt"),
    "meta truncated": lambda d: _truncate(d / META),
    "meta not json": lambda d: (d / META).write_text("{not json"),
    "meta timing edited": _edit_meta(_set_timing),
    "meta version edited": _edit_meta(_set_version),
    "meta file hash edited": _edit_meta(_set_file_hash),
    "meta self hash removed": _edit_meta(_drop_self_hash_and_edit),
    "meta deleted": lambda d: (d / META).unlink(),
    "file deleted": lambda d: (d / "launch.cu").unlink(),
    "file added": lambda d: (d / "evil.py").write_text("import os\n"),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_bad_entry_is_rejected_then_rebuilt(cache, how):
    key, e = make_key(2), make_entry(2)
    path = cache.put(key, e)
    CORRUPTIONS[how](path)
    with pytest.warns(CacheWarning, match="ignoring bad entry"):
        assert cache.get(key) is None
    assert cache.stats.rejected and cache.stats.rejected[0][0] == str(path)
    assert [i.ok for i in cache.verify()] == [False]
    # The next put replaces the bad entry; the rebuilt one loads without warnings.
    assert cache.put(key, e) == path
    with _no_warnings() as w:
        assert cache.get(key) == e
    assert not w
    assert [i.ok for i in cache.verify()] == [True]
    assert not (cache.root / ".trash").exists() or not any((cache.root / ".trash").iterdir())


def test_entry_of_another_key_in_the_directory_is_rejected(cache):
    # A directory renamed to another key's name: meta.json's key no longer matches its name.
    k1, k2 = make_key(3), make_key(4)
    p1 = cache.put(k1, make_entry(3))
    p1.rename(cache.root / k2.dirname())
    with pytest.warns(CacheWarning, match="does not match its key"):
        assert cache.get(k2) is None


def test_version_change_misses_cleanly(cache):
    key = make_key(5)
    cache.put(key, make_entry(5))
    newer = CacheKey(key.program_digest, key.bucket, key.dtype, key.arch, key.backend,
                     (("superopt", "0.1.0"), ("triton", "3.7.0")) + VERSIONS[2:], key.label)
    assert newer.digest() != key.digest() and newer.dirname() != key.dirname()
    with _no_warnings() as w:
        assert cache.get(newer) is None
    assert not w and cache.stats.misses == 1 and not cache.stats.rejected
    cache.put(newer, make_entry(6))
    assert cache.get(newer) == make_entry(6) and cache.get(key) == make_entry(5)


def test_key_digest_covers_every_field_but_label():
    base = make_key(0)
    fields = base.fields()
    for f, new in [("program_digest", "ffff"), ("bucket", "b16"), ("dtype", "fp16"),
                   ("arch", "sm80"), ("backend", "cuda"), ("versions", [["superopt", "0.2.0"]])]:
        changed = CacheKey.from_fields({**fields, f: new})
        assert changed.digest() != base.digest(), f
    relabeled = CacheKey.from_fields({**fields, "label": "other"})
    assert relabeled.digest() == base.digest() and relabeled.dirname() != base.dirname()
    assert CacheKey.from_fields(json.loads(json.dumps(fields))) == base
    assert CacheKey(*[getattr(base, f) for f in ("program_digest", "bucket", "dtype", "arch",
                                                 "backend")], VERSIONS, "a/b c..").dirname() \
        .startswith("a_b_c")


def test_read_only_cache_computes_in_memory_and_reports(tmp_path):
    user = tmp_path / "user"
    writer = KernelCache(user, shipped_dir=False)
    writer.put(make_key(1), make_entry(1))
    ro = KernelCache(user, shipped_dir=False, read_only=True)
    assert ro.get(make_key(1)) == make_entry(1)            # existing entries still load
    key = make_key(2)
    with ro.lock(key):
        assert ro.get(key) is None
        assert ro.put(key, make_entry(2)) is None
    assert not (user / key.dirname()).exists()
    got = ro.get(key)
    assert got == make_entry(2) and got.origin == "memory"
    assert ro.stats.unsaved == [key.dirname()] and "computed in memory only" in ro.stats.summary()
    with pytest.raises(PermissionError):
        ro.clear()
    with pytest.raises(PermissionError):
        ro.import_(tmp_path / "x.tar")


def test_unwritable_directory_is_detected_as_read_only(tmp_path):
    # A path below a regular file can never be created, whoever runs the test (root included).
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ro = KernelCache(blocker / "cache", shipped_dir=False)
    assert ro.read_only
    assert ro.put(make_key(1), make_entry(1)) is None and ro.get(make_key(1)) == make_entry(1)


def test_read_only_knob(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_READ_ONLY", "1")
    assert KernelCache(tmp_path, shipped_dir=False).read_only
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_READ_ONLY", "0")
    assert not KernelCache(tmp_path, shipped_dir=False).read_only


def test_export_shipped_prefers_the_entry_with_a_stored_verdict(tmp_path):
    """Two toolchains' entries of one kernel ship as one copy: the one patch() can trust as is."""
    import dataclasses

    build = KernelCache(tmp_path / "build", shipped_dir=False)
    older = VERSIONS[:1] + (("superopt-src", "0ld"),) + VERSIONS[1:]
    newer = VERSIONS[:1] + (("superopt-src", "n3w"),) + VERSIONS[1:]
    plain = make_entry(1)
    stamped = dataclasses.replace(plain, meta={**plain.meta, "verified": True, "verdict": "equivalent"})
    for first, second in (((older, plain), (newer, stamped)), ((older, stamped), (newer, plain))):
        root = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        build = KernelCache(root / "build", shipped_dir=False)
        build.put(make_key(1, versions=first[0]), first[1])
        build.put(make_key(1, versions=second[0]), second[1])
        shipped = root / "kernels_cache"
        assert build.export_shipped(shipped) == 1
        got = KernelCache(root / "user", shipped_dir=shipped).get(make_key(1))
        assert got.origin == "shipped" and got.meta["verified"] is True


def test_shipped_layer_serves_text_only_and_user_layer_wins(tmp_path):
    build = KernelCache(tmp_path / "build", shipped_dir=False)
    build.put(make_key(1), make_entry(1))
    build.put(make_key(2), make_entry(2))
    shipped = tmp_path / "kernels_cache"
    assert build.export_shipped(shipped) == 2
    assert not list(shipped.glob("*/*.cubin")) and not list(shipped.glob(".*"))
    assert sorted({p.name for p in shipped.glob("*/*")}) == ["meta.json", "ugraph.txt"]  # no source either
    # A user on another toolchain (triton/torch/CUDA differ; superopt the same) hits the shipped
    # μGraph text, with no binary and no source: the caller renders and compiles.
    other = (("superopt", "0.1.0"), ("triton", "3.9.0"), ("torch", "2.13.0+cpu"))
    user = KernelCache(tmp_path / "user", shipped_dir=shipped)
    key1 = make_key(1, versions=other)
    got = user.get(key1)
    assert got.origin == "shipped" and got.binaries == {}
    assert got.ugraph_text == make_entry(1).ugraph_text and got.sources == {} and not got.signed
    user.put(key1, make_entry(11))
    assert user.get(key1).origin == "user" and user.get(key1) == make_entry(11) and user.get(key1).signed
    assert user.stats.hits == {"memory": 0, "user": 3, "shipped": 1}
    # Another superopt version: the searched graph may differ, so the shipped entry misses.
    assert user.get(make_key(2, versions=(("superopt", "0.2.0"),) + other[1:])) is None
    # A damaged shipped entry is rejected with a warning, never loaded.
    _flip(next(shipped.glob("*-2-*/ugraph.txt")), 5)
    with pytest.warns(CacheWarning):
        assert user.get(make_key(2, versions=other)) is None
    layers = sorted((i.layer, i.ok) for i in user.verify())
    assert layers == [("shipped", False), ("shipped", True), ("user", True)]


def test_ls_verify_clear(cache, tmp_path):
    for i in range(3):
        cache.put(make_key(i), make_entry(i))
    (cache.root / "not-an-entry").mkdir()       # never deleted: not named like an entry
    rows = cache.ls()
    assert [r.key for r in rows] == sorted([make_key(i) for i in range(3)], key=lambda k: k.dirname())
    assert all(r.ok and r.binaries == ("kernel.cubin",) and r.created for r in rows)
    _flip(cache.root / make_key(1).dirname() / "kernel.cubin", 0)
    assert [r.ok for r in cache.ls()] == [True] * 3                 # ls reads meta.json only
    bad = [r for r in cache.verify(remove=True) if not r.ok]
    assert [r.key for r in bad] == [make_key(1)] and "hash mismatch" in bad[0].reason
    assert len(cache.ls()) == 2
    assert cache.clear() == 2 and cache.ls() == []
    assert (cache.root / "not-an-entry").is_dir()


def test_lock_times_out_while_held(cache):
    key = make_key(1)
    other = KernelCache(cache.root, shipped_dir=False)
    with cache.lock(key):
        with pytest.raises(TimeoutError):
            with other.lock(key, timeout=0.2):
                pass
        with other.lock(make_key(2), timeout=0.2):   # other keys are not blocked
            pass
    with other.lock(key, timeout=0.2):
        pass


def test_default_dir_resolution_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MIRAGE_SERVE_CACHE_DIR", raising=False)
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "mirage_serve"
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", "")         # empty counts as unset
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "mirage_serve"
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env"
    assert KernelCache(shipped_dir=False).root == tmp_path / "env"
    assert default_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert KernelCache(str(tmp_path / "arg"), shipped_dir=False).root == tmp_path / "arg"
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", "~/envtilde")
    assert default_cache_dir() == tmp_path / "home" / "envtilde"


def test_bad_file_names_and_meta_are_refused_before_writing(cache):
    e = make_entry(1)
    for name in ("../x.py", "meta.json", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            cache.put(make_key(1), type(e)(e.ugraph_text, {name: "x"}, {}, {}))
    with pytest.raises(TypeError):
        cache.put(make_key(1), type(e)(e.ugraph_text, {}, {}, {"t": object()}))
    assert cache.ls() == [] and not any((cache.root / ".tmp").iterdir())


def test_failed_write_keeps_the_kernel_in_memory(cache, monkeypatch):
    from mirage_serve.cache import entry as entry_mod

    def disk_full():
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(entry_mod, "between_files", disk_full)
    key = make_key(1)
    with pytest.warns(CacheWarning, match="No space left"):
        assert cache.put(key, make_entry(1)) is None
    assert cache.get(key) == make_entry(1) and cache.get(key).origin == "memory"
    assert cache.stats.unsaved == [key.dirname()] and cache.ls() == []
    assert not any((cache.root / ".tmp").iterdir())
    monkeypatch.setattr(entry_mod, "between_files", None)
    assert cache.put(make_key(2), make_entry(2)) is not None      # the cache itself still works


def test_committed_shipped_cache_is_whole_and_binary_free(tmp_path):
    from mirage_serve.cache import shipped_cache_dir

    shipped = shipped_cache_dir()
    assert shipped is not None and (shipped / "__init__.py").is_file()
    rows = KernelCache(tmp_path, shipped_dir=shipped).verify(layers=("shipped",))
    assert [(r.path.name, r.reason) for r in rows if not r.ok] == []
    assert [r.path.name for r in rows if r.binaries] == []
    # μGraph text and metadata only: generated source is rendered again, never shipped
    assert sorted({p.name for p in shipped.glob("*/*")}) == ["meta.json", "ugraph.txt"]
    # Only entries, the package marker and the fitted cost-model constants (mirage_serve.cost_fit): no temp, lock
    # or trash folders committed by accident.
    from mirage_serve.cost_fit import FILE
    stray = [p.name for p in shipped.iterdir()
             if p.name not in ("__init__.py", "__pycache__", FILE) and p.name not in {r.path.name for r in rows}]
    assert stray == []


def test_entry_summary_line_and_cheap_import(cache):
    import subprocess
    import sys

    cache.put(make_key(1), make_entry(1))
    cubin = cache.root / make_key(1).dirname() / "kernel.cubin"
    line = cache.ls()[0].summary()
    assert line.startswith("user    ok  rmsnorm_matmul-sm90-bf16-k896-n73-1-") and "bf16 b4 sm90 triton" in line
    assert line.endswith("KiB  binary")
    cubin.write_bytes(b"\0")
    bad = cache.verify()[0].summary()
    assert " BAD " in bad and "hash mismatch" in bad
    code = "import sys, mirage_serve.cache; print(sorted({'torch', 'numpy', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
