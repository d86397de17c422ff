"""Moving cache entries between machines: tar export/import, and the binary-free shipped form.

An archive holds cache entries as μGraph text and metadata only: whatever it came with, nothing
from an archive is executed or believed. Import never calls ``tarfile.extract``: each member is
checked (a regular file at ``<entry>/<file>`` or ``programs/<fingerprint>.json``, or such a
directory; no absolute paths, no ``..``, no links or devices, sizes bounded), its bytes are written
by us into a private staging directory, every staged entry is checked (format, hashes) and written
again as its μGraph and metadata alone, unsigned, and only then renamed into the cache. patch()
then verifies each against the site's own program on first use and signs it
(``mirage_serve.optimize``). Binaries, sources and traced program records in an archive are
dropped: a program record is believed only from this user's own tracing (``programs.py``). One
unsafe member rejects the whole archive before anything is installed.

The functions take the cache (a ``store.KernelCache``) as an argument and never import the store:
the store imports this module.
"""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Iterator

from . import gpu_rows, records
from .entry import FILE_NAME, META, BadEntry, CacheEntry, read_entry, write_entry
from .files import ENTRY_NAME, PROGRAMS_DIR, CacheWarning, install_entry
from .key import CacheKey

MAX_MEMBER_BYTES = 1 << 30          # a cubin is ~100 KB-10 MB; this only stops tar bombs
MAX_ARCHIVE_BYTES = 16 << 30


def _good_entries(cache) -> Iterator[tuple[CacheKey, CacheEntry]]:
    """Every verified user-cache entry, then the in-memory (unsaved) ones; bad ones warned."""
    for info in cache.verify(layers=("user",)):
        if not info.ok:
            warnings.warn(f"mirage_serve cache: skipping bad entry {info.path}: {info.reason}",
                          CacheWarning, stacklevel=3)
            continue
        try:
            yield read_entry(info.path, info.key)
        except (BadEntry, OSError) as e:   # replaced or damaged since verify
            warnings.warn(f"mirage_serve cache: skipping entry {info.path}: {e}", CacheWarning,
                          stacklevel=3)
    yield from cache.memory_entries()


def export_cache(cache, path: Path) -> int:
    """Write every good entry (user cache + unsaved in-memory ones) to the tar file `path`
    (gzip if it ends in .gz/.tgz), atomically, as μGraph text and metadata (what an import keeps).
    Returns the number of entries written."""
    mode = "w:gz" if path.name.endswith((".gz", ".tgz")) else "w"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    n = 0
    seen: set[str] = set()
    try:
        with tarfile.open(tmp, mode, format=tarfile.PAX_FORMAT) as tar:
            for key, entry in _good_entries(cache):
                if key.dirname() in seen:
                    continue
                seen.add(key.dirname())
                with tempfile.TemporaryDirectory() as td:
                    d = Path(td) / key.dirname()
                    d.mkdir()
                    write_entry(d, key, text_only(entry))
                    for f in sorted(d.iterdir()):
                        _add_bytes(tar, f"{d.name}/{f.name}", f.read_bytes())
                n += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def text_only(entry: CacheEntry) -> CacheEntry:
    """The entry as μGraph text and metadata: what may travel between users and machines."""
    return replace(entry, sources={}, binaries={}, origin="", signed=False)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    # Fixed owner and mtime: the same cache exports to the same bytes (reproducible images).
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
    tar.addfile(ti, io.BytesIO(data))


def _member_path(m: tarfile.TarInfo) -> tuple[str, str | None]:
    """(entry dir name, file name or None for a directory member), or ValueError if unsafe."""
    name = m.name
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise ValueError(f"unsafe archive member {name!r}: absolute or odd path")
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if ".." in parts:
        raise ValueError(f"unsafe archive member {name!r}: '..' in path")
    if not (m.isreg() or m.isdir()):
        raise ValueError(f"unsafe archive member {name!r}: not a regular file or directory")
    if parts and parts[0] == PROGRAMS_DIR:   # traced site programs: programs/<fingerprint>.json
        if m.isdir() and len(parts) == 1:
            return parts[0], None
        if m.isdir() or len(parts) != 2 or not records.NAME.match(parts[1]):
            raise ValueError(f"archive member {name!r}: not {PROGRAMS_DIR}/<fingerprint>.json")
        if m.size > records.MAX_BYTES:
            raise ValueError(f"archive member {name!r} is too large ({m.size} bytes)")
        return parts[0], parts[1]
    if not parts or not ENTRY_NAME.match(parts[0]):
        raise ValueError(f"archive member {name!r} is not inside a cache entry directory")
    if m.isdir():
        if len(parts) != 1:
            raise ValueError(f"archive member {name!r}: nested directory")
        return parts[0], None
    if len(parts) != 2 or not (FILE_NAME.match(parts[1]) or parts[1] == META):
        raise ValueError(f"archive member {name!r}: not <entry>/<file>")
    if m.size > MAX_MEMBER_BYTES:
        raise ValueError(f"archive member {name!r} is too large ({m.size} bytes)")
    return parts[0], parts[1]


def stage(path: Path, staging: Path) -> None:
    """Check every member of the tar `path` and write the safe ones into `staging`; ValueError (and
    nothing kept) if one is unsafe."""
    total = 0
    with tarfile.open(path, "r:*") as tar:
        for m in tar:
            entry_name, file_name = _member_path(m)
            d = staging / entry_name
            d.mkdir(exist_ok=True)
            if file_name is None:
                continue
            total += m.size
            if total > MAX_ARCHIVE_BYTES:
                raise ValueError(f"archive {path} unpacks to more than {MAX_ARCHIVE_BYTES} bytes")
            src = tar.extractfile(m)
            with open(d / file_name, "xb") as out:    # "x": a duplicated member is an error
                shutil.copyfileobj(src, out)


def import_cache(root: Path, tmp_dir: Path, path: Path) -> int:
    """Install the archive's entries that check into the cache at `root` (staged under `tmp_dir`,
    a private directory on the same file system), as unsigned μGraph text and metadata; returns
    how many were new. Entries already present (and good) are kept; bad entries in the archive,
    and its program records, are warned about and skipped."""
    staging = Path(tempfile.mkdtemp(dir=tmp_dir, prefix="import."))
    installed = 0
    try:
        stage(path, staging)
        if (staging / PROGRAMS_DIR).is_dir():
            n = len(list((staging / PROGRAMS_DIR).iterdir()))
            warnings.warn(f"mirage_serve cache: {n} program records in {path.name} not imported (a traced program "
                          "is believed only from this user's own tracing)", CacheWarning, stacklevel=3)
        for d in sorted(staging.iterdir()):
            if d.name == PROGRAMS_DIR or d.name.startswith("."):
                continue
            try:
                key, entry = read_entry(d)
                dropped = sorted(set(entry.sources) | set(entry.binaries))
                clean = staging / f".clean.{d.name}"
                clean.mkdir()
                write_entry(clean, key, text_only(entry))
            except (BadEntry, OSError) as e:
                warnings.warn(f"mirage_serve cache: archive entry {d.name} rejected: {e}", CacheWarning, stacklevel=3)
                continue
            if dropped:
                warnings.warn(f"mirage_serve cache: archive entry {d.name}: {', '.join(dropped)} dropped (only its "
                              "μGraph is imported, and verified on first use)", CacheWarning, stacklevel=3)
            _, new = install_entry(root, clean, key, good=lambda p, k=key: read_entry(p, k))
            installed += new
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return installed


def export_shipped(cache, dest: Path) -> int:
    """Write every good entry into `dest` (a ``kernels_cache/`` folder) in shipped form: μGraph
    text and metadata (with the launch choice and the digest of the code it was profiled on),
    keyed by `CacheKey.for_shipped`. Returns the number of entries now there new."""
    # Entries of several toolchains (or superopt sources) can hold one kernel: one shipped copy,
    # preferring one that was verified (a user verifies it again on first use all the same).
    chosen: dict[str, tuple[CacheKey, CacheEntry]] = {}
    for key, entry in _good_entries(cache):
        sk = key.for_shipped()
        have = chosen.get(sk.dirname())
        if have is None or (_has_verdict(entry) and not _has_verdict(have[1])):
            chosen[sk.dirname()] = (sk, entry)
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest, prefix=".ship."))
    n = 0
    try:
        for sk, entry in chosen.values():
            d = staging / sk.dirname()
            d.mkdir()
            write_entry(d, sk, text_only(entry))
            _, new = install_entry(dest, d, sk, good=lambda p, k=sk: read_entry(p, k))
            n += new
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return n


def _has_verdict(entry: CacheEntry) -> bool:
    return entry.meta.get("verified") is True


def ship_into(src: Path, dest: Path, labels: set[str] | None = None) -> list[tuple[str, str]]:
    """Bring the shipped-form entries of `src` (what ``export_shipped`` wrote on some GPU) into `dest`
    (``kernels_cache/``): a new entry is added; one whose μGraph `dest` already holds adds its launch as the
    row of the GPU that timed it (``gpu_rows.with_row``), so the other GPUs' choices stay; one with another
    μGraph replaces `dest`'s (the rows held launches of the old μGraph). ``labels``: only entries of these
    labels (``mlp_out-m8``). Returns (entry, what was done), an entry that names no GPU left as it was."""
    done = []
    for path in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")
                       and (labels is None or p.name.rsplit("-", 1)[0] in labels)):
        key, entry = read_entry(path)
        have = dest / path.name
        if not have.exists():
            action, new = "added", entry
        else:
            _, old = read_entry(have, key)
            if old.ugraph_text != entry.ugraph_text:
                action, new = "replaced: another μGraph", entry
            elif not entry.meta.get("timed_on"):
                done.append((path.name, "kept: the new entry names no GPU it was timed on"))
                continue
            else:
                action = f"launch row for {entry.meta['timed_on']}"
                new = replace(old, meta=gpu_rows.with_row(old.meta, entry.meta))
        # a folder under version control, written by one maintainer's tool: no reader to race
        staging = Path(tempfile.mkdtemp(dir=dest, prefix=".ship."))
        try:
            write_entry(staging, key, text_only(new))
            shutil.rmtree(have, ignore_errors=True)
            os.rename(staging, have)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        done.append((path.name, action))
    return done
