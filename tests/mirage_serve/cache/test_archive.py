"""Export/import of caches as tar files: μGraph text and metadata travel (never binaries, sources or
program records), unsafe or tampered archives are refused, imported entries arrive unsigned."""
from __future__ import annotations

import io
import tarfile

import pytest

from mirage_serve.cache import CacheWarning, KernelCache, records
from mirage_serve.cache.archive import text_only
from mirage_serve.cache.entry import write_entry

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
    with tarfile.open(archive) as tar:   # what travels: the μGraph and its metadata
        assert sorted({m.name.split("/")[-1] for m in tar.getmembers()}) == ["meta.json", "ugraph.txt"]
    assert dst.import_(archive) == 3
    assert all(dst.get(make_key(i)) == text_only(make_entry(i)) for i in range(3))
    assert not any(dst.get(make_key(i)).signed for i in range(3))   # verified on first use, then signed
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
    assert dst.get(make_key(1)) == text_only(make_entry(1)) and dst.get(make_key(5)) == text_only(make_entry(5))


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
    "duplicate member": _member(f"{ENTRY}/ugraph.txt"),
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


def _full_archive(tmp_path, n: int, edit=None):
    """A tar of `n` whole entries (binaries and sources too, as someone else's tool might write),
    unsigned; `edit(name, data) -> data` changes a member's bytes after the hashes were taken."""
    out = tmp_path / "full.tar"
    with tarfile.open(out, "w") as tar:
        for i in range(n):
            d = tmp_path / "full" / make_key(i).dirname()
            d.mkdir(parents=True)
            write_entry(d, make_key(i), make_entry(i))
            for f in sorted(d.iterdir()):
                data = f.read_bytes()
                data = edit(f"{d.name}/{f.name}", data) if edit else data
                ti = tarfile.TarInfo(f"{d.name}/{f.name}")
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    return out


def test_tampered_entry_in_archive_is_skipped(tmp_path):
    def flip(name, data):
        if name == f"{make_key(1).dirname()}/ugraph.txt":
            return data[:10] + bytes([data[10] ^ 1]) + data[11:]
        return data

    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    with pytest.warns(CacheWarning, match="rejected: ugraph.txt content hash mismatch"):
        assert dst.import_(_full_archive(tmp_path, 2, flip)) == 1
    assert dst.get(make_key(0)) == text_only(make_entry(0)) and dst.get(make_key(1)) is None


def test_imported_binaries_and_sources_are_dropped(tmp_path):
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    with pytest.warns(CacheWarning, match="kernel.cubin, kernel.py, launch.cu dropped"):
        assert dst.import_(_full_archive(tmp_path, 1)) == 1
    assert sorted(p.name for p in (dst.root / make_key(0).dirname()).iterdir()) == ["meta.json", "ugraph.txt"]
    got = dst.get(make_key(0))
    assert got.binaries == {} and got.sources == {} and not got.signed
    assert [i.ok for i in dst.verify(layers=("user",))] == [True]


def _record(i: int) -> tuple[str, bytes]:
    body = {"text": f"graph g{i}\n", "digest": f"{i:016x}", "sources": [["arg", 0]]}
    return f"{i:064x}.json", records.encode(body, b"k" * 32)


def test_program_records_do_not_travel(tmp_path):
    src = _filled(tmp_path / "src", 1)
    folder = src.root / "programs"
    folder.mkdir()
    name, data = _record(1)
    (folder / name).write_bytes(data)
    archive = tmp_path / "cache.tar"
    assert src.export(archive) == 1
    with tarfile.open(archive) as tar:
        assert not [m for m in tar.getnames() if m.startswith("programs")]
    # an archive that carries one anyway (another tool's, or an older export): not installed
    full = _tar_with(tmp_path, tarfile.TarInfo(f"programs/{name}"), data)
    dst = KernelCache(tmp_path / "dst", shipped_dir=False)
    with pytest.warns(CacheWarning, match="1 program records .* not imported"):
        assert dst.import_(full) == 1
    assert not (dst.root / "programs").exists()
