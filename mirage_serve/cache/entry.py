"""One cache entry on disk: a directory of plain files plus meta.json with their sha256 (no pickle).

    rmsnorm_matmul-sm90-bf16-k4096-n6144-1a2b3c4d/
      ugraph.txt      the winning μGraph, canonical text (superopt.ir.text)
      source.py       generated sources, UTF-8 text (any number, any allowed name; source.py is
                      the Triton module, source.cu the CUDA one: mirage_serve.cache.builds)
      <kernel>.<hash16>.cubin / .json, triton-kernels.json
                      compiled binaries, raw bytes (none in the shipped cache): per Triton kernel
                      its cubin and Triton's metadata, and a manifest (superopt.runtime.binaries);
                      module.cubin for the CUDA backend
      meta.json       {"format", "key", "key_digest", "files": {name: {kind, sha256, bytes}},
                       "meta": caller's JSON (timings, verdict, created…), "self_sha256"}

``self_sha256`` hashes the canonical JSON of everything else in meta.json, so an edit to any
metadata field (a timing, a version, a file hash) is detected like a flipped bit in a binary.
`read_entry` trusts nothing it has not checked; every failure is a `BadEntry` with the reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .key import CacheKey

FORMAT = 1
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


def meta_json(key: CacheKey, files: dict[str, tuple[str, bytes]], user_meta: dict) -> bytes:
    doc = {
        "format": FORMAT,
        "key": key.fields(),
        "key_digest": key.digest(),
        "files": {n: {"kind": k, "sha256": _sha256(b), "bytes": len(b)} for n, (k, b) in files.items()},
        "meta": user_meta,
    }
    doc["self_sha256"] = _sha256(_canonical(doc))
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False).encode() + b"\n"


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_entry(dirpath: Path, key: CacheKey, entry: CacheEntry) -> None:
    """Write the entry's files into the (new, empty) directory `dirpath`; meta.json last.

    Not atomic by itself: the store writes into a private temp directory and renames it."""
    files = entry_files(entry)
    meta = meta_json(key, files, entry.meta)  # fails on non-JSON meta before any file is written
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
    """meta.json parsed and self-hash checked, else BadEntry."""
    try:
        doc = json.loads((dirpath / META).read_bytes())
    except FileNotFoundError:
        raise BadEntry("meta.json is missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadEntry(f"meta.json is malformed: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("self_sha256"), str):
        raise BadEntry("meta.json is malformed: no self_sha256")
    if doc.get("format") != FORMAT:
        raise BadEntry(f"entry format {doc.get('format')!r} is not {FORMAT}")
    claimed = doc.pop("self_sha256")
    if _sha256(_canonical(doc)) != claimed:
        raise BadEntry("meta.json was modified (self hash mismatch)")
    return doc


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


def read_entry(dirpath: Path, expect: CacheKey | None = None) -> tuple[CacheKey, CacheEntry]:
    """Load and fully check one entry directory. `expect`: the key the caller looked up."""
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
        p = dirpath / name
        if p.is_symlink() or not p.is_file():
            raise BadEntry(f"{name} is not a regular file")
        data = p.read_bytes()
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
    return key, CacheEntry(ugraph, sources, binaries, user_meta)
