"""The per-user secret and the keyed MAC that mark what this user's own processes wrote to a cache.

A cache directory may be written by someone else and an archive may come from anywhere, so a plain
content hash proves nothing: anyone can recompute it. What this user's processes write (entries,
traced program records) carries an HMAC-SHA256 under a secret only this user can read; what
carries none, or a wrong one, is *unsigned*. Unsigned data is never executed and never believed:
binaries are rebuilt, a μGraph is verified against the site's program again, a program record is
traced again (see docs/architecture.md, "Cache trust").

The secret is 32 random bytes, hex, in ``~/.config/mirage_serve/cache-key`` (``MIRAGE_SERVE_CACHE_KEY``
overrides the path), outside the cache directory so that whoever can write the cache cannot
swap it. It is created on first use with mode 0600 (written to a temporary file, then linked into
place, so two processes creating it at once agree on one secret). A secret file that is a symlink,
not ours, readable by others, or malformed is refused: the process then signs nothing and trusts
nothing (everything is re-verified and rebuilt), with one warning.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import os
import stat
import tempfile
import warnings
from pathlib import Path

from .. import knobs

SECRET_BYTES = 32
# Domain separation: an entry's MAC can never be replayed as a program record's, or back.
ENTRY = b"mirage_serve cache entry v2\0"
RECORD = b"mirage_serve program record v2\0"


class TrustWarning(UserWarning):
    """The cache's secret could not be used: nothing is signed or trusted in this process."""


def secret_path() -> Path:
    """Where the secret lives: MIRAGE_SERVE_CACHE_KEY, else ~/.config/mirage_serve/cache-key."""
    p = knobs.CACHE_KEY.get()
    return p.absolute() if p is not None else Path.home() / ".config" / "mirage_serve" / "cache-key"


def user_secret(path: Path | None = None) -> bytes | None:
    """The secret at ``path`` (default `secret_path()`), created if missing; None (warned once per
    path) when it cannot be created or is not safe to use."""
    return _secret(path or secret_path())


@functools.lru_cache(maxsize=8)
def _secret(path: Path) -> bytes | None:
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        return _refuse(path, str(e))
    try:
        _create(path)
        return _read(path)
    except (OSError, ValueError) as e:
        return _refuse(path, str(e))


def _refuse(path: Path, why: str) -> None:
    warnings.warn(f"mirage_serve cache: secret {path} not used ({why}); cache entries are neither signed nor "
                  "trusted in this process: every kernel is verified and built again", TrustWarning, stacklevel=4)
    return None


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid != os.getuid():
            raise ValueError(f"owned by uid {st.st_uid}, not by this user ({os.getuid()})")
        if st.st_mode & 0o077:
            raise ValueError(f"mode {stat.S_IMODE(st.st_mode):04o} lets others read or write it; expected 0600")
        raw = os.read(fd, 4 * SECRET_BYTES)
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise ValueError("malformed (expected hex)") from None
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"malformed ({len(secret)} bytes, expected {SECRET_BYTES})")
    return secret


def _create(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-key.")   # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(SECRET_BYTES).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)   # fails if another process created it first: then theirs is used
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def mac(secret: bytes, domain: bytes, message: bytes) -> str:
    """HMAC-SHA256 of ``message`` under ``secret``, separated by ``domain``, hex."""
    return hmac.new(secret, domain + message, hashlib.sha256).hexdigest()


def signed(secret: bytes | None, domain: bytes, message: bytes, claimed) -> bool:
    """Whether ``claimed`` is ``message``'s MAC under ``secret`` (False without a secret)."""
    if secret is None or not isinstance(claimed, str):
        return False
    return hmac.compare_digest(mac(secret, domain, message), claimed)
