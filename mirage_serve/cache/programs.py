"""Extracted programs, remembered across processes, so that a warm patch() traces nothing.

Tracing a site with ``torch.export`` costs ~0.1 s a program, plus ~0.5 s of torch.export's first
import in a fresh process: on a warm kernel cache that was half of patch()'s time (Llama-3.1-8B on
the H200: extract 1.05 s of 2.41 s). The program a site traces to is a function of the site's
code and structure, so it is stored under a fingerprint of exactly that:

* ``sites.signature`` of the site's modules (types, scalar attributes such as eps, parameter
  shapes and dtypes),
* the source of every module class's ``forward`` in the site (an edited or upgraded model code
  gives another fingerprint), and of the callables they hold as attributes (the activation),
* the versions of superopt (with its source digest: extraction code), torch and transformers,
* the program name, its rows bucket, dtype and device type.

Not covered: the code of helpers a ``forward`` calls (module-level functions, other methods) —
for Hugging Face models the transformers version stands for them; whoever edits such a helper in
a model of their own clears the records (``mirage-serve cache clear``).

A record is a small JSON file in ``<user cache>/programs/`` holding the program's μGraph text and
where each input comes from, with a sha256 of its contents and a MAC under this user's secret
(``records.py``); a record that is malformed, fails its hash or MAC, is a symlink, or parses to a
program of another digest is ignored (warned) and the site is traced again. Records are written
atomically (temp file + rename, both relative to the opened ``programs/`` directory, which must be
a real directory: a ``programs/`` planted as a symlink is never written through); a read-only cache
(a deployment image's) is read but stores none.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import secrets
import warnings
from importlib import metadata

import torch

from superopt.ir import digest, from_text, to_text
from superopt.lax.extract import Extracted

from ..patching.sites import signature
from . import records
from .files import PROGRAMS_DIR, CacheWarning, SymlinkError, read_file
from .key import versions_now
from .store import KernelCache


@functools.lru_cache(maxsize=None)
def _code_of(cls: type) -> str:
    return _source(cls.forward, f"{cls.__module__}.{cls.__qualname__}.forward")


def _source(fn, fallback: str) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):   # no source (builtins, compiled): the qualified name stands for it
        return fallback


def _callables(module: torch.nn.Module) -> list[str]:
    """Non-module callables a module holds — ``act_fn = ACT2FN[...]``, or a ``forward`` set on the
    instance — each with its code, since each can change what the module computes."""
    out = []
    for k, v in sorted(vars(module).items()):
        if k.startswith("_") or isinstance(v, (torch.nn.Module, torch.Tensor)) or not callable(v):
            continue
        if inspect.isfunction(v) or inspect.ismethod(v):
            fn = getattr(v, "__func__", v)
            out.append(f"{k}={fn.__module__}.{fn.__qualname__}:{_source(fn, '')}")
            continue
        cls = v if isinstance(v, type) else type(v)
        out.append(f"{k}={cls.__module__}.{cls.__qualname__}:{_code_of(cls) if hasattr(cls, 'forward') else ''}")
    return out


def fingerprint(module: torch.nn.Module, name: str, rows: int, dtype: torch.dtype) -> str:
    """sha256 of what ``extract(module, (x: [rows, D] dtype,), name)`` depends on."""
    h = hashlib.sha256()
    device = next((t.device.type for t in module.parameters()), "none")   # aten decompositions may differ
    parts = [repr(signature(module)), name, str(rows), str(dtype), device, repr(versions_now())]
    try:
        parts.append(metadata.version("transformers"))
    except metadata.PackageNotFoundError:
        parts.append("no transformers")
    for _, m in module.named_modules():
        parts.append(_code_of(type(m)))
        parts.extend(_callables(m))
    for p in parts:
        h.update(p.encode() + b"\0")
    return h.hexdigest()


class ProgramMemo:
    """``get(fp)`` / ``put(fp, extracted)`` over ``cache``'s user directory (or nowhere)."""

    def __init__(self, cache: KernelCache | None):
        self.folder = None if cache is None else cache.root / PROGRAMS_DIR
        self.writable = cache is not None and not cache.read_only   # a read-only cache is still read
        self.cache = cache

    def get(self, fp: str) -> Extracted | None:
        if self.folder is None:
            return None
        path = self.folder / f"{fp}.json"
        try:
            raw = read_file(path, records.MAX_BYTES)
        except SymlinkError as e:
            warnings.warn(f"mirage_serve cache: ignoring program record {path}: {e}; the site is traced again",
                          CacheWarning, stacklevel=3)
            return None
        except OSError:
            return None
        try:
            body = records.decode(raw, self.cache.secret, signed=True)
            graph = from_text(body["text"])
            if digest(graph) != body["digest"]:
                raise ValueError("the program text does not parse to its recorded digest")
            sources = tuple((kind, ref) for kind, ref in body["sources"])
        except (ValueError, KeyError, TypeError) as e:
            warnings.warn(f"mirage_serve cache: ignoring program record {path}: {e}; the site is traced again",
                          CacheWarning, stacklevel=3)
            return None
        return Extracted(graph, sources)

    def put(self, fp: str, ex: Extracted) -> None:
        if self.folder is None or not self.writable:
            return
        body = {"text": to_text(ex.graph), "digest": digest(ex.graph), "sources": [list(s) for s in ex.sources]}
        try:
            _write_record(self.folder, f"{fp}.json", records.encode(body, self.cache.secret))
        except OSError as e:   # a full or vanished disk, a planted link: a trace next time, nothing more
            warnings.warn(f"mirage_serve cache: program record not stored ({e})", CacheWarning, stacklevel=3)


def _write_record(folder, name: str, data: bytes) -> None:
    """Write ``folder/name`` atomically without following a link at ``folder`` or inside it."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(parents=True)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)   # ELOOP if it is a link
    try:
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
