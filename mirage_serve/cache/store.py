"""The kernel cache store: a writable user cache layered over the read-only shipped cache.

Lookup order: entries computed in memory this process (read-only caches) → the user cache
(argument > MIRAGE_SERVE_CACHE_DIR > ~/.cache/mirage_serve) → the shipped ``kernels_cache/``
package data (μGraph text and metadata only, keyed without toolchain versions: see
`CacheKey.for_shipped`; a hit there has no binary, so the caller compiles and may `put`).

Trust (``trust.py``): `put` signs every entry with this user's secret. `get` hands out an entry's
binaries only when it is signed (``CacheEntry.signed``); an unsigned one (shipped, imported, or
written by someone else) comes back as μGraph text and metadata, which the caller verifies against
its own program before use (``mirage_serve.optimize``). Symlinks inside the cache are refused.

Writes are atomic: an entry is written into a private directory under ``.tmp/`` and renamed into
place with one ``rename(2)``, so readers see a whole entry or none, and a writer killed mid-way
leaves only a private temp directory. A bad entry (hash mismatch, malformed JSON, edited metadata,
other versions) is never loaded: `get` warns and misses, and the next `put` moves it to ``.trash/``
and installs the fresh one. `lock(key)` is an advisory ``flock`` so that concurrent processes
patching the same model compute each kernel once; correctness never depends on it.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from .. import knobs
from . import archive, trust
from .entry import BadEntry, CacheEntry, is_signed, read_entry, read_key, read_meta, write_entry
from .files import (ENTRY_NAME, PROGRAMS_DIR, CacheWarning, discard_entry, install_entry, private_dir,
                    real_dir)
from .key import CacheKey

_CACHEDIR_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# mirage_serve kernel cache\n"


def default_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The user cache directory: `cache_dir` > MIRAGE_SERVE_CACHE_DIR > ~/.cache/mirage_serve."""
    if cache_dir is not None and str(cache_dir) != "":
        return Path(cache_dir).expanduser().absolute()
    env = knobs.CACHE_DIR.get()
    if env is not None:
        return env.absolute()
    return Path.home() / ".cache" / "mirage_serve"


def shipped_cache_dir() -> Path | None:
    """The `mirage_serve.kernels_cache` package folder, or None if it is not a plain directory."""
    from importlib import resources

    try:
        p = Path(str(resources.files("mirage_serve.kernels_cache")))
    except ModuleNotFoundError:
        # A source checkout run through PYTHONPATH (the GPU machine) has no package-dir
        # mapping: the folder sits beside mirage_serve/ at the repository root.
        p = Path(__file__).resolve().parents[2] / "kernels_cache"
        if not (p / "__init__.py").is_file():
            return None
    return p if p.is_dir() else None


@dataclass
class EntryInfo:
    """One row of `ls` / `verify`."""

    layer: str                    # "user" or "shipped"
    path: Path
    key: CacheKey | None          # None when meta.json itself is unreadable
    files: dict[str, int]         # name -> bytes, as found on disk
    binaries: tuple[str, ...]     # files meta.json lists as compiled binaries
    created: str | None
    ok: bool
    reason: str = ""              # why the entry is bad ("" when ok)
    signed: bool = False          # its MAC checks under this user's secret (verify only)

    def summary(self) -> str:
        """One line for `mirage-serve cache ls`: layer, status, name, key facts, size."""
        k = self.key
        facts = f"{k.dtype} {k.bucket} {k.arch} {k.backend}" if k else "?"
        size = sum(self.files.values()) / 1024
        status = "ok " if self.ok else "BAD"
        tail = ("binary" if self.binaries else "text only") + ("" if self.signed else ", unsigned")
        line = f"{self.layer:7} {status} {self.path.name}  {facts}  {size:.1f} KiB  {tail}"
        return line + (f"  ({self.reason})" if self.reason else "")


@dataclass
class CacheStats:
    """What this cache object did; `patch` copies it into its report."""

    hits: dict[str, int] = field(default_factory=lambda: {"memory": 0, "user": 0, "shipped": 0})
    misses: int = 0
    puts: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)   # (path, reason)
    unsaved: list[str] = field(default_factory=list)               # dirnames kept in memory only

    def summary(self) -> str:
        h = self.hits
        s = (f"hits user {h['user']}, shipped {h['shipped']}, memory {h['memory']}; "
             f"misses {self.misses}; written {self.puts}")
        if self.rejected:
            s += f"; rejected {len(self.rejected)}"
        if self.unsaved:
            s += f"; {len(self.unsaved)} computed in memory only (not saved: cache not writable)"
        return s


class KernelCache:
    """User cache over shipped cache. `shipped_dir`: None → the package's kernels_cache/, False → none.
    `read_only`: None → MIRAGE_SERVE_CACHE_READ_ONLY, else probe whether `cache_dir` is writable.
    `secret`: the key entries are signed with; None → this user's (``trust.user_secret``)."""

    def __init__(self, cache_dir=None, shipped_dir=None, read_only: bool | None = None,
                 secret: bytes | None = None):
        self.root = default_cache_dir(cache_dir)
        if shipped_dir is False:
            self.shipped = None
        elif shipped_dir is None:
            self.shipped = shipped_cache_dir()
        else:
            self.shipped = Path(shipped_dir)
        self.stats = CacheStats()
        self._memory: dict[str, tuple[CacheKey, CacheEntry]] = {}
        self._thread_locks: dict[str, threading.Lock] = {}
        self._secret = secret
        if read_only is None:
            read_only = knobs.CACHE_READ_ONLY.get() or not self._probe_writable()
        self.read_only = bool(read_only)

    def __repr__(self) -> str:
        return (f"KernelCache({str(self.root)!r}, shipped={str(self.shipped)!r}, "
                f"read_only={self.read_only})")

    # ------------------------------------------------------------ set-up

    def _probe_writable(self) -> bool:
        # os.access is wrong for root and for some mounts; creating a file is the real test.
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=".probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError:
            return False
        tag = self.root / "CACHEDIR.TAG"   # tells backup tools to skip this directory
        with contextlib.suppress(OSError):   # O_NOFOLLOW | O_EXCL: never through a planted link
            fd = os.open(tag, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(_CACHEDIR_TAG)
        return True

    @property
    def secret(self) -> bytes | None:
        """This user's secret (read or created on first use); None if it cannot be used."""
        if self._secret is None:
            self._secret = trust.user_secret()
        return self._secret

    def private_dir(self, name: str) -> Path:
        """`root/name` (created): .tmp, .locks, .trash; never looks like an entry, never a symlink."""
        return private_dir(self.root, name)

    # ------------------------------------------------------------ lookup

    def get(self, key: CacheKey, count: bool = True) -> CacheEntry | None:
        """The entry for `key` from the first layer that has a good one, else None (a miss).
        `count=False`: a second look at an entry already counted (not added to `stats`)."""
        mem = self._memory.get(key.digest())
        if mem is not None and mem[0] == key:
            self.stats.hits["memory"] += count
            return replace(mem[1], origin="memory", signed=True)   # made by this process
        found = self._load(self.root / key.dirname(), key, "user", count)
        if found is None and self.shipped is not None:
            sk = key.for_shipped()
            found = self._load(self.shipped / sk.dirname(), sk, "shipped", count)
            if found is not None:
                found = replace(found, signed=False)   # package data is nobody's own writing
        if found is not None and not found.signed:
            # Not this user's writing: its μGraph and metadata are data to check, nothing in it
            # runs (binaries rebuilt, source rendered again) and its verdict is not believed.
            found = replace(found, binaries={}, sources={})
        if found is None:
            self.stats.misses += count
        return found

    def _load(self, path: Path, key: CacheKey, layer: str, count: bool = True) -> CacheEntry | None:
        if not os.path.lexists(path):
            return None
        try:
            _, entry = read_entry(path, key, self.secret)
        except (BadEntry, OSError) as e:
            if count:
                self._reject(path, str(e))
            return None
        self.stats.hits[layer] += count
        return replace(entry, origin=layer)

    def _reject(self, path: Path, reason: str) -> None:
        self.stats.rejected.append((str(path), reason))
        warnings.warn(f"mirage_serve cache: ignoring bad entry {path}: {reason}; it will be rebuilt",
                      CacheWarning, stacklevel=4)

    # ------------------------------------------------------------ store

    def put(self, key: CacheKey, entry: CacheEntry, replace_existing: bool = False) -> Path | None:
        """Install `entry` atomically and return its directory; None if the cache is read-only
        (the entry is then kept in memory for this process and listed in `stats.unsaved`).

        A good entry already there wins (first complete writer) unless `replace_existing`: then
        the new version replaces it (a whole entry either way; call under `lock(key)`, see
        `install_entry`)."""
        if not self.read_only:
            try:
                tmp = Path(tempfile.mkdtemp(dir=self.private_dir(".tmp"),
                                            prefix=f"{key.dirname()}.{os.getpid()}."))
            except OSError as e:
                warnings.warn(f"mirage_serve cache: {self.root} is not writable ({e}); "
                              "keeping results in memory", CacheWarning, stacklevel=2)
                self.read_only = True
        if self.read_only:
            return self._keep_in_memory(key, entry)
        try:
            write_entry(tmp, key, entry, self.secret)
            final, _ = install_entry(self.root, tmp, key, replace_existing, lambda p: read_entry(p, key))
        except OSError as e:   # disk full, directory gone: patch() must go on with the kernel
            warnings.warn(f"mirage_serve cache: could not save {key.dirname()} ({e}); "
                          "keeping it in memory", CacheWarning, stacklevel=2)
            return self._keep_in_memory(key, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.stats.puts += 1
        return final

    def discard(self, key: CacheKey) -> None:
        """Remove `key`'s user entry, if there is one and the cache is writable (call under its lock)."""
        if not self.read_only:
            discard_entry(self.root, self.root / key.dirname())

    def _keep_in_memory(self, key: CacheKey, entry: CacheEntry) -> None:
        self._memory[key.digest()] = (key, replace(entry, origin="memory", signed=True))
        self.stats.unsaved.append(key.dirname())

    @contextlib.contextmanager
    def lock(self, key: CacheKey, timeout: float | None = None) -> Iterator[None]:
        """Hold the cross-process lock for `key` (blocks; TimeoutError after `timeout` seconds).

        Where no lock file can be made (a read-only cache) the lock is only per process: other
        processes could not share the result anyway."""
        fd = None
        if not self.read_only:
            # Lock files are never deleted: deleting one while another process waits on it
            # would let a third process lock a fresh file and run concurrently with the waiter.
            with contextlib.suppress(OSError):
                path = self.private_dir(".locks") / f"{key.dirname()}.lock"
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if fd is None:
            tl = self._thread_locks.setdefault(key.digest(), threading.Lock())
            if not tl.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(f"cache lock for {key.dirname()} not acquired in {timeout} s")
            try:
                yield
            finally:
                tl.release()
            return
        try:
            _flock(fd, timeout, key)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ maintenance

    def _entry_dirs(self, layer: str) -> list[Path]:
        base = self.root if layer == "user" else self.shipped
        if base is None or not base.is_dir():
            return []
        # a symlink named like an entry is no entry (audit.py reports it)
        return sorted(p for p in base.iterdir() if ENTRY_NAME.match(p.name) and real_dir(p))

    def _info(self, path: Path, layer: str, full: bool) -> EntryInfo | None:
        """The entry's row; None if it vanished meanwhile (replaced or cleared by another process)."""
        key, created, binaries = None, None, ()
        try:
            files = {p.name: p.lstat().st_size for p in path.iterdir()}
        except FileNotFoundError:
            return None
        signed = False
        try:
            doc = read_meta(path)
            signed = layer == "user" and is_signed(doc, self.secret)
            key = read_key(path, doc)
            meta = doc.get("meta")
            created = meta.get("created") if isinstance(meta, dict) else None
            listed = doc.get("files") if isinstance(doc.get("files"), dict) else {}
            binaries = tuple(n for n, i in listed.items()
                             if isinstance(i, dict) and i.get("kind") == "binary")
            if full:
                read_entry(path, key)
                _trusted_form(doc, layer, signed)
        except (BadEntry, OSError) as e:
            return EntryInfo(layer, path, key, files, binaries, created, False, str(e), signed)
        return EntryInfo(layer, path, key, files, binaries, created, True, "", signed)

    def ls(self, layers: tuple[str, ...] = ("user", "shipped")) -> list[EntryInfo]:
        """Entries of the given layers, checking only meta.json (fast); `verify` checks files."""
        return self._rows(layers, full=False)

    def _rows(self, layers: tuple[str, ...], full: bool) -> list[EntryInfo]:
        rows = (self._info(p, layer, full) for layer in layers for p in self._entry_dirs(layer))
        return [r for r in rows if r is not None]

    def verify(self, layers: tuple[str, ...] = ("user", "shipped"), remove: bool = False
               ) -> list[EntryInfo]:
        """Fully check every entry (hashes of every file, and its MAC where it carries one or
        anything executable). `remove`: delete bad user entries. ``audit.py`` checks the rest of
        the directory (program records, symlinks, permissions)."""
        out = self._rows(layers, full=True)
        if remove:
            self._require_writable("verify --remove")
            for info in out:
                if not info.ok and info.layer == "user":
                    discard_entry(self.root, info.path)
        return out

    def clear(self) -> int:
        """Delete every user-cache entry (and stale temp directories and the extracted programs of
        ``programs.py``); returns how many entries.
        The shipped cache is never touched. Only directories named like entries are removed."""
        self._require_writable("clear")
        entries = self._entry_dirs("user")
        for p in entries:
            discard_entry(self.root, p)
        for private in (".tmp", ".trash", PROGRAMS_DIR):
            if real_dir(self.root / private):
                shutil.rmtree(self.root / private, ignore_errors=True)
            elif os.path.lexists(self.root / private):
                (self.root / private).unlink()   # a planted link goes, never what it points to
        self._memory.clear()
        return len(entries)

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            raise PermissionError(f"cannot {what}: cache directory {self.root} is read-only")

    def memory_entries(self) -> list[tuple[CacheKey, CacheEntry]]:
        """Entries computed this process but not saved (read-only cache)."""
        return list(self._memory.values())

    def export(self, path) -> int:
        """Write every good entry, as μGraph text and metadata, to the tar file `path`."""
        return archive.export_cache(self, Path(path))

    def import_(self, path) -> int:
        """Add the archive's entries (text only, unsigned: verified on first use)."""
        self._require_writable("import")
        return archive.import_cache(self.root, self.private_dir(".tmp"), Path(path))

    def export_shipped(self, dest) -> int:
        """Copy good entries, binary-free and keyed for shipping, into `dest` (kernels_cache/)."""
        return archive.export_shipped(self, Path(dest))


def _trusted_form(doc: dict, layer: str, signed: bool) -> None:
    """BadEntry if the entry holds what only a signed user entry may: an unsigned entry in the user
    cache carrying binaries or sources (patch() never writes one; someone else did), a MAC that
    does not check, or a shipped entry with anything but its μGraph."""
    listed = doc.get("files") if isinstance(doc.get("files"), dict) else {}
    extra = sorted(n for n, i in listed.items() if not (isinstance(i, dict) and i.get("kind") == "ugraph"))
    if layer == "shipped":
        if extra:
            raise BadEntry(f"shipped entry holds more than its μGraph: {extra}")
        return
    if signed:
        return
    if "mac" in doc:
        raise BadEntry("MAC does not check: written under another secret, or tampered with")
    if extra:
        raise BadEntry(f"unsigned entry holds files that could run: {extra}")


def _flock(fd: int, timeout: float | None, key: CacheKey) -> None:
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"cache lock for {key.dirname()} not acquired in {timeout} s")
            time.sleep(0.05)
