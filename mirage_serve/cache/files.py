"""The cache directory's layout on disk: names, symlink-refusing reads, atomic install and removal.

Nothing here follows a symlink inside the cache: a file is opened with ``O_NOFOLLOW`` and checked
to be a regular file, a directory is checked with ``lstat``. A cache directory may be writable by
someone else (a shared or misconfigured one), and a link planted there must neither make us read
a file outside it (a ``meta.json`` pointing at an identical copy elsewhere) nor make us write
outside it (a ``programs/`` that is a link). The cache root itself may be reached through links
(a user's ``~/.cache`` on another disk): only what is inside it is refused.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import time
from pathlib import Path

ENTRY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*-[0-9a-f]{8}$")
PROGRAMS_DIR = "programs"   # extracted programs of patch() sites (mirage_serve.cache.programs)
PRIVATE_DIRS = (".tmp", ".locks", ".trash", PROGRAMS_DIR)
MAX_FILE_BYTES = 1 << 30


class CacheWarning(UserWarning):
    """A cache entry was rejected, or a result could not be saved."""


class SymlinkError(OSError):
    """A symlink (or other non-regular file) where the cache expects a plain file or directory."""


def read_file(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``; SymlinkError if it is a link or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SymlinkError(f"{path.name} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SymlinkError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path.name} is too large ({st.st_size} bytes)")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    finally:
        os.close(fd)


def real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory and not a symlink to one (False if it is missing)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def private_dir(root: Path, name: str) -> Path:
    """``root/name`` created if missing; SymlinkError if something other than a directory is there."""
    p = root / name
    with contextlib.suppress(FileExistsError):
        p.mkdir(parents=True)
    if not real_dir(p):
        raise SymlinkError(f"{p} is a symlink or not a directory: refused")
    return p


def install_entry(root: Path, tmp: Path, key, replace_existing: bool = False,
                  good=None) -> tuple[Path, bool]:
    """Rename the fully written entry directory `tmp` into `root` as `key`'s entry.

    Returns (entry path, whether `tmp` was installed). If a good entry (``good(path)`` returns
    without raising ValueError) is already there (a concurrent writer won), it is kept and `tmp`
    is left for the caller to delete: the first complete entry wins. A bad one is moved aside
    first, then replaced. `replace_existing`: a good one is replaced too (a new version of an
    immutable entry: the old one is renamed away, then the new one renamed in; a reader without
    the key's lock may miss in between, never sees a mix of the two)."""
    final = root / key.dirname()
    for _ in range(8):
        try:
            os.rename(tmp, final)
            return final, True
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):   # ENOTDIR: a file or link there
                raise
        if replace_existing or not real_dir(final):   # a symlink squatting on the name goes too
            discard_entry(root, final)
            continue
        try:
            if good is not None:
                good(final)
            return final, False
        except ValueError:
            discard_entry(root, final)
        except FileNotFoundError:
            continue   # another process moved it away between our rename and our read
    raise OSError(f"could not install cache entry {final}: it keeps changing under us")


def discard_entry(root: Path, path: Path) -> None:
    """Remove an entry directory: rename it out of sight (atomic) first, then delete it, so no
    reader ever sees a half-deleted entry. A symlink is removed itself, never what it points to."""
    trash_dir = private_dir(root, ".trash")
    trash = trash_dir / f"{path.name}.{os.getpid()}.{time.monotonic_ns()}"
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    if real_dir(trash):
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink(missing_ok=True)
    with contextlib.suppress(OSError):   # still in use by a concurrent discard
        trash_dir.rmdir()
