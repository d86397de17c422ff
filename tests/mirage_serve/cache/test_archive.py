"""Export/import of caches as tar files: exact round trip, and unsafe or tampered archives refused."""
from __future__ import annotations

import io
import tarfile

import pytest

from mirage_serve.cache import CacheWarning, KernelCache, records

from ._helpers import make_entry, make_key


def _filled(root, n=3) -> KernelCache:
    c = KernelCache(root, shipped_dir=False)
    for i in range(n):
        c.put(make_key(i), make_entry(i))
    return c


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_export_import_round_trip(tmp_path, suffix):
    src = _filled(tmp_path / "src")
    archive = tmp_path / f"cache{suffix}"
    assert src.export(archive) == 3
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    assert dst.import_(archive) == 3
    assert all(dst.get(make_key(i)) == make_entry(i) for i in range(3))
    assert dst.import_(archive) == 0                   # already present: kept, not duplicated
    assert len(dst.ls()) == 3 and not any((dst.root / ".tmp").iterdir())
    # Exports are reproducible: same cache, same bytes (docker layer caching).
    again = tmp_path / f"again{suffix}"
    src.export(again)
    if suffix == ".tar":
        assert again.read_bytes() == archive.read_bytes()


def test_export_skips_bad_entries_and_includes_unsaved(tmp_path):
    src = _filled(tmp_path / "src", 2)
    cubin = src.root / make_key(0).dirname() / "kernel.cubin"
    cubin.write_bytes(cubin.read_bytes()[:-1])
    ro = KernelCache(src.root, shipped_dir=False, read_only=True)
    ro.put(make_key(5), make_entry(5))                  # computed in memory only
    with pytest.warns(CacheWarning, match="skipping bad entry"):
        assert ro.export(tmp_path / "a.tar") == 2
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    assert dst.import_(tmp_path / "a.tar") == 2
    assert dst.get(make_key(0)) is None
    assert dst.get(make_key(1)) == make_entry(1) and dst.get(make_key(5)) == make_entry(5)


def _tar_with(tmp_path, extra: tarfile.TarInfo, data: bytes = b"x"):
    """A valid exported archive plus one extra member."""
    good = tmp_path / "good.tar"
    _filled(tmp_path / "src", 1).export(good)
    out = tmp_path / "evil.tar"
    with tarfile.open(good) as src, tarfile.open(out, "w") as tar:
        for m in src.getmembers():
            tar.addfile(m, src.extractfile(m))
        extra.size = len(data) if extra.isreg() else 0
        tar.addfile(extra, io.BytesIO(data) if extra.isreg() else None)
    return out


def _member(name, kind=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, link
    return ti


ENTRY = make_key(0).dirname()
UNSAFE = {
    "absolute": _member("/tmp/evil-abcdef12/x.py"),
    "dotdot": _member(f"{ENTRY}/../../x.py"),
    "symlink": _member(f"{ENTRY}/link.py", tarfile.SYMTYPE, "/etc/passwd"),
    "hardlink": _member(f"{ENTRY}/hard.py", tarfile.LNKTYPE, f"{ENTRY}/kernel.py"),
    "device": _member(f"{ENTRY}/dev", tarfile.CHRTYPE),
    "fifo": _member(f"{ENTRY}/fifo", tarfile.FIFOTYPE),
    "top-level file": _member("x.py"),
    "not an entry dir": _member("somedir/x.py"),
    "nested": _member(f"{ENTRY}/sub/x.py"),
    "duplicate member": _member(f"{ENTRY}/kernel.py"),
    "program record name": _member("programs/notafingerprint.json"),
    "program record nested": _member(f"programs/sub/{'a' * 64}.json"),
    "program record dotdot": _member(f"programs/../{'a' * 64}.json"),
}


@pytest.mark.parametrize("how", sorted(UNSAFE))
def test_unsafe_archive_is_refused_whole(tmp_path, how):
    evil = _tar_with(tmp_path, UNSAFE[how])
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    with pytest.raises((ValueError, FileExistsError)):
        dst.import_(evil)
    assert dst.ls() == [] and not any((dst.root / ".tmp").iterdir())
    assert not (tmp_path / "x.py").exists() and not (tmp_path.parent / "x.py").exists()


def test_tampered_entry_in_archive_is_skipped(tmp_path):
    good = tmp_path / "good.tar"
    _filled(tmp_path / "src", 2).export(good)
    out = tmp_path / "tampered.tar"
    with tarfile.open(good) as src, tarfile.open(out, "w") as tar:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == f"{make_key(1).dirname()}/kernel.cubin":
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            tar.addfile(m, io.BytesIO(data))
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    with pytest.warns(CacheWarning, match="rejected: kernel.cubin content hash mismatch"):
        assert dst.import_(out) == 1
    assert dst.get(make_key(0)) == make_entry(0) and dst.get(make_key(1)) is None


def _record(i: int) -> tuple[str, bytes]:
    body = {"text": f"graph g{i}\n", "digest": f"{i:016x}", "sources": [["arg", 0]]}
    return f"{i:064x}.json", records.encode(body)


def test_program_records_travel_with_the_archive(tmp_path):
    src = _filled(tmp_path / "src", 1)
    folder = src.root / "programs"
    folder.mkdir()
    for i in (1, 2):
        name, data = _record(i)
        (folder / name).write_bytes(data)
    (folder / f"{3:064x}.json").write_bytes(b"{not json")      # damaged: warned about, not exported
    archive = tmp_path / "cache.tar"
    with pytest.warns(CacheWarning, match="skipping program record"):
        assert src.export(archive) == 1
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    assert dst.import_(archive) == 1
    assert sorted(p.name for p in (dst.root / "programs").iterdir()) == [_record(1)[0], _record(2)[0]]
    assert (dst.root / "programs" / _record(1)[0]).read_bytes() == _record(1)[1]


def test_tampered_program_record_in_archive_is_skipped(tmp_path):
    src = _filled(tmp_path / "src", 1)
    (src.root / "programs").mkdir()
    for i in (1, 2):
        name, data = _record(i)
        (src.root / "programs" / name).write_bytes(data)
    good, out = tmp_path / "good.tar", tmp_path / "tampered.tar"
    src.export(good)
    with tarfile.open(good) as a, tarfile.open(out, "w") as tar:
        for m in a.getmembers():
            data = a.extractfile(m).read()
            if m.name == f"programs/{_record(2)[0]}":
                data = data.replace(b"g2", b"g9")
            tar.addfile(m, io.BytesIO(data))
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    with pytest.warns(CacheWarning, match="program record .* rejected"):
        assert dst.import_(out) == 1
    assert [p.name for p in (dst.root / "programs").iterdir()] == [_record(1)[0]]
