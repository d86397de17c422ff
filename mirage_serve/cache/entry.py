"""One cache entry on disk: a directory of plain files plus meta.json with their sha256 (no pickle).

    rmsnorm_matmul-sm90-bf16-k4096-n6144-1a2b3c4d/
      ugraph.txt      the winning μGraph, canonical text (superopt.ir.text)
      <kernel>.<hash16>.cubin / .json, triton-kernels.json
                      compiled binaries, raw bytes (user cache only): per Triton kernel its cubin and
                      Triton's metadata, and a manifest (superopt.runtime.binaries)
      (other text)    "source" files: inert text, never executed (generated source is always
                      rendered again from the μGraph; entries written now hold none)
      meta.json       {"format", "key", "key_digest", "files": {name: {kind, sha256, bytes}},
                       "meta": caller's JSON (timings, verdict, created…), "self_sha256", "mac"}

``self_sha256`` hashes the canonical JSON of everything but itself and ``mac``, so an edit to any
metadata field (a timing, a version, a file hash) is detected like a flipped bit in a binary. It
proves integrity, not origin: anyone can recompute it. ``mac`` (``trust.py``) is an HMAC of the
same bytes under this user's secret; an entry whose MAC checks is ``signed``: written by this
user's own process. Only a signed entry's binaries are loaded and its stored verdict believed
(``store.KernelCache.get``). `read_entry` trusts nothing it has not checked; every failure is a
`BadEntry` with the reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import trust
from .files import SymlinkError, read_file
from .key import CacheKey

FORMAT = 2   # 2: signed by a keyed MAC (1: unkeyed self hash only)
# Format 1 (written before entries were signed) is still read: as an unsigned entry, i.e. μGraph
# text that is verified on first use and then written again as format 2 (its searches are kept).
READABLE = (1, FORMAT)
META = "meta.json"
UGRAPH = "ugraph.txt"
FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")
_KINDS = ("ugraph", "source", "binary")

# Test hook: called between two files of a write, so a test can kill a writer mid-entry.
between_files: Callable[[], None] | None = None


class BadEntry(ValueError):
    """An entry that must not be loaded: corrupt, tampered, malformed, or for another key."""


@dataclass
class CacheEntry:
    ugraph_text: str
    sources: dict[str, str]
    binaries: dict[str, bytes]
    meta: dict
    # Where a lookup found it: "user", "shipped", "memory" ("" when built by the caller).
    origin: str = field(default="", compare=False)
    # Whether its MAC checks under this user's secret (set by read_entry; see the module docstring).
    signed: bool = field(default=False, compare=False)


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _check_names(entry: CacheEntry) -> None:
    names = list(entry.sources) + list(entry.binaries)
    if len(set(names)) != len(names):
        raise ValueError(f"a file name is both a source and a binary: {names}")
    for n in names:
        if not FILE_NAME.match(n) or n in (META, UGRAPH):
            raise ValueError(f"cache entry file name {n!r} is not allowed")


def entry_files(entry: CacheEntry) -> dict[str, tuple[str, bytes]]:
    """name -> (kind, content bytes), in the order they are written (ugraph first)."""
    _check_names(entry)
    files = {UGRAPH: ("ugraph", entry.ugraph_text.encode())}
    files.update({n: ("source", s.encode()) for n, s in sorted(entry.sources.items())})
    files.update({n: ("binary", bytes(b)) for n, b in sorted(entry.binaries.items())})
    return files


def meta_json(key: CacheKey, files: dict[str, tuple[str, bytes]], user_meta: dict,
              secret: bytes | None = None) -> bytes:
    """meta.json's bytes: self-hashed, and signed when ``secret`` is given."""
    doc = {
        "format": FORMAT,
        "key": key.fields(),
        "key_digest": key.digest(),
        "files": {n: {"kind": k, "sha256": _sha256(b), "bytes": len(b)} for n, (k, b) in files.items()},
        "meta": user_meta,
    }
    body = _canonical(doc)
    doc["self_sha256"] = _sha256(body)
    if secret is not None:
        doc["mac"] = trust.mac(secret, trust.ENTRY, body)
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False).encode() + b"\n"


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_entry(dirpath: Path, key: CacheKey, entry: CacheEntry, secret: bytes | None = None) -> None:
    """Write the entry's files into the (new, empty) directory `dirpath`; meta.json last, signed
    with `secret` if given.

    Not atomic by itself: the store writes into a private temp directory and renames it."""
    files = entry_files(entry)
    meta = meta_json(key, files, entry.meta, secret)  # fails on non-JSON meta before any file is written
    for name, (_, data) in files.items():
        _write_file(dirpath / name, data)
        if between_files is not None:
            between_files()
    _write_file(dirpath / META, meta)
    fd = os.open(dirpath, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(dirpath: Path) -> dict:
    """meta.json parsed and self-hash checked, else BadEntry. Its ``mac`` (if any) is kept in the
    result as ``"mac"``, unchecked: `is_signed` checks it."""
    if dirpath.is_symlink():
        raise BadEntry("the entry directory is a symlink")
    try:
        doc = json.loads(read_file(dirpath / META))
    except FileNotFoundError:
        raise BadEntry("meta.json is missing") from None
    except SymlinkError as e:
        raise BadEntry(str(e)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadEntry(f"meta.json is malformed: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("self_sha256"), str):
        raise BadEntry("meta.json is malformed: no self_sha256")
    if doc.get("format") not in READABLE:
        raise BadEntry(f"entry format {doc.get('format')!r} is not one of {READABLE}")
    claimed, mac = doc.pop("self_sha256"), doc.pop("mac", None)
    if _sha256(_canonical(doc)) != claimed:
        raise BadEntry("meta.json was modified (self hash mismatch)")
    if mac is not None:
        doc["mac"] = mac
    return doc


def is_signed(doc: dict, secret: bytes | None) -> bool:
    """Whether meta.json's `doc` (from `read_meta`) carries a MAC that checks under `secret`."""
    body = {k: v for k, v in doc.items() if k != "mac"}
    return trust.signed(secret, trust.ENTRY, _canonical(body), doc.get("mac"))


def read_key(dirpath: Path, doc: dict) -> CacheKey:
    try:
        key = CacheKey.from_fields(doc.get("key"))
    except (TypeError, ValueError) as e:
        raise BadEntry(str(e)) from None
    if key.digest() != doc.get("key_digest"):
        raise BadEntry("key digest in meta.json does not match its key fields")
    if key.dirname() != dirpath.name:
        raise BadEntry(f"directory name {dirpath.name!r} does not match its key ({key.dirname()})")
    return key


def read_entry(dirpath: Path, expect: CacheKey | None = None, secret: bytes | None = None
               ) -> tuple[CacheKey, CacheEntry]:
    """Load and fully check one entry directory. `expect`: the key the caller looked up; `secret`:
    this user's, to tell whether the entry is signed (``CacheEntry.signed``)."""
    doc = read_meta(dirpath)
    key = read_key(dirpath, doc)
    if expect is not None and key != expect:
        diff = [f for f, v in expect.fields().items() if key.fields()[f] != v]
        raise BadEntry(f"entry belongs to another key (differs in {', '.join(diff)})")
    listed = doc.get("files")
    if not isinstance(listed, dict) or listed.get(UGRAPH, {}).get("kind") != "ugraph":
        raise BadEntry("meta.json lists no ugraph.txt")
    present = {p.name for p in dirpath.iterdir()} - {META}
    if present != set(listed):
        raise BadEntry(f"files differ from meta.json: extra {sorted(present - set(listed))}, "
                       f"missing {sorted(set(listed) - present)}")
    ugraph, sources, binaries = "", {}, {}
    for name, info in listed.items():
        if not isinstance(info, dict) or info.get("kind") not in _KINDS or not FILE_NAME.match(name):
            raise BadEntry(f"meta.json entry for {name!r} is malformed")
        try:
            data = read_file(dirpath / name)
        except SymlinkError as e:
            raise BadEntry(str(e)) from None
        if _sha256(data) != info.get("sha256"):
            raise BadEntry(f"{name} content hash mismatch ({len(data)} bytes)")
        try:
            if info["kind"] == "ugraph":
                ugraph = data.decode()
            elif info["kind"] == "source":
                sources[name] = data.decode()
            else:
                binaries[name] = data
        except UnicodeDecodeError:
            raise BadEntry(f"{name} is not UTF-8 text") from None
    user_meta = doc.get("meta")
    if not isinstance(user_meta, dict):
        raise BadEntry("meta.json 'meta' is not an object")
    return key, CacheEntry(ugraph, sources, binaries, user_meta, signed=is_signed(doc, secret))
