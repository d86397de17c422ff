"""Triton binaries of a rendered module as plain files: count compiles, capture them, load them back.

Triton's JIT compiles a kernel on its first launch (or ``warmup``), looking first in its own cache
(``~/.triton/cache`` or ``TRITON_CACHE_DIR``, through its ``CacheManager``) under a hash of the
kernel source, options and toolchain. This module works with that machinery rather than around it:

* ``watch(fns)``: while active, records every kernel of ``fns`` that Triton compiled (a miss in its
  cache) or loaded (a hit), with the files of its cache group, through
  ``triton.knobs.compilation.listener`` (chained to any listener already set, restored on exit;
  kernels of other functions are ignored). The files captured are kept per kernel hash.
* ``export_files({kernel: hash})`` → flat ``{file name: bytes}`` (cubin + Triton's metadata JSON
  per kernel, and a manifest ``triton-kernels.json``): what a kernel cache entry stores. No pickle.
* ``seed(files)``: puts those files back into Triton's cache through its own ``CacheManager``
  (``put`` / ``put_group``: atomic, content-addressed, so it changes nothing for other kernels),
  so the JIT's first launch finds them and compiles nothing, even with an empty ``~/.triton``.
  If the toolchain computes another hash (other Triton, ptxas, options), Triton simply misses and
  compiles, and ``watch`` counts it.
* ``warmup(tm, target=None)``: compiles (or loads) every kernel of a module without launching it,
  with ``JITFunction.warmup`` and dtype placeholders: exactly the specialisation a launch on
  16-byte-aligned torch tensors uses, so the JIT's launch later hits its in-memory cache. With a
  ``target`` (``GPUTarget``) it runs on a machine without that GPU (ahead-of-time, CI, image
  builds): the JIT is pointed at the target by a minimal driver stand-in for the duration.
"""
from __future__ import annotations

import contextlib
import json
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..codegen.launch import Launch
from ..codegen.triton import kernel_param_dtypes
from .grid_dependency import launch_options

MANIFEST = "triton-kernels.json"
MANIFEST_FORMAT = 1
# Files of a Triton cache group that loading does not need (intermediate IR: large, text).
_OPTIONAL = ("source", "ttir", "ttgir", "llir", "ptx", "amdgcn")

_lock = threading.Lock()
# Triton hash -> {triton file name -> path in Triton's cache}: every cache group a watch saw in
# this process, so a graph whose kernels an earlier graph compiled (same source and launch) can
# still export them.
_SEEN: dict[str, dict[str, str]] = {}


@dataclass
class CompileLog:
    """What Triton did for the watched kernels: names compiled (cache misses) and loaded (hits);
    ``hashes``: kernel name -> Triton hash of the variant ``warmup`` produced."""

    compiled: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    hashes: dict[str, str] = field(default_factory=dict)


def _fn_name(src) -> str | None:
    fn = getattr(src, "fn", None)
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", None)


@contextlib.contextmanager
def watch(fns: Iterable) -> Iterator[CompileLog]:
    """Record compiles and cache loads of the JIT functions ``fns`` while the block runs."""
    from triton import knobs

    ids = {id(f) for f in fns}
    log = CompileLog()
    comp = getattr(knobs, "compilation", None)
    if comp is None or not hasattr(comp, "listener"):   # a Triton without listeners: count nothing
        yield log
        return
    previous = comp.listener

    def listener(*args, **kw):
        if previous is not None:
            previous(*args, **kw)
        src = kw.get("src")
        if id(getattr(src, "fn", None)) not in ids:
            return
        (log.loaded if kw.get("cache_hit") else log.compiled).append(_fn_name(src))
        h = (kw.get("metadata") or {}).get("hash")
        if h:
            _capture(h, kw.get("metadata_group") or {})

    comp.listener = listener
    try:
        yield log
    finally:
        comp.listener = previous


def _capture(h: str, metadata_group: dict) -> None:
    """Remember where Triton's cache keeps group ``h`` (paths only: profiling compiles hundreds of
    candidates, and only the winners' files are read, by ``export_files``)."""
    paths = {fname: str(path) for fname, path in metadata_group.items()
             if fname.rsplit(".", 1)[-1] not in _OPTIONAL}
    if any(f.endswith(".json") for f in paths):
        with _lock:
            _SEEN[h] = paths


def export_files(hashes: dict[str, str]) -> dict[str, bytes]:
    """Flat files for the kernels ``{name: Triton hash}`` (groups seen by ``watch`` in this
    process): ``<kernel>.<hash16>.<ext>`` per file, plus the manifest mapping them back to
    Triton's names. Empty when any kernel was not seen (a partial set would look warm and still
    compile)."""
    out: dict[str, bytes] = {}
    kernels = []
    for name, h in sorted(hashes.items()):
        with _lock:
            paths = _SEEN.get(h)
        if not paths:
            return {}
        mapping = {}
        for fname, path in sorted(paths.items()):
            flat = f"{name[:64]}.{h[:16]}.{fname.rsplit('.', 1)[-1]}"  # cache file names ≤ 128
            try:
                out[flat] = Path(path).read_bytes()
            except OSError:   # removed from Triton's cache meanwhile
                return {}
            mapping[fname] = flat
        kernels.append({"kernel": name, "hash": h, "files": mapping})
    out[MANIFEST] = json.dumps({"format": MANIFEST_FORMAT, "kernels": kernels}, sort_keys=True,
                               indent=1).encode()
    return out


class BadBinaries(ValueError):
    pass


def seed(files: dict[str, bytes]) -> int:
    """Install exported ``files`` into Triton's cache (``triton.runtime.cache.get_cache_manager``);
    returns how many kernel groups were added (groups already present are left alone)."""
    from triton.runtime.cache import get_cache_manager

    try:
        doc = json.loads(files[MANIFEST])
        kernels = doc["kernels"] if doc.get("format") == MANIFEST_FORMAT else None
        if not isinstance(kernels, list):
            raise ValueError("unknown manifest format")
        plan = [(k["kernel"], k["hash"], {t: files[f] for t, f in k["files"].items()}) for k in kernels]
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise BadBinaries(f"Triton binaries manifest is malformed: {e!r}") from None
    added = 0
    for name, h, group in plan:
        meta_name = f"{name}.json"
        if meta_name not in group or any("/" in t or t.startswith(".") for t in group):
            raise BadBinaries(f"Triton binaries of {name}: bad file list {sorted(group)}")
        manager = get_cache_manager(h)
        if manager.get_group(meta_name) is not None:
            continue
        # metadata JSON first: CompiledKernel reads the group's first .json as the metadata
        paths = {meta_name: manager.put(group[meta_name], meta_name, binary=False)}
        for t, data in group.items():
            if t != meta_name:
                paths[t] = manager.put(data, t, binary=True)
        manager.put_group(meta_name, paths)
        added += 1
    return added


def _dtypes(tm, spec) -> list:
    import torch

    dts = kernel_param_dtypes(spec, tm.graph).values()
    return [getattr(torch, d) for d in dts] * (2 if spec.paired else 1)


class _TargetDriver:
    """What ``JITFunction.warmup`` asks of the active driver, for a GPU that is not here."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def warm(tm, module, launch: dict[str, tuple] | None, device, files: dict[str, bytes] | None = None,
         name: str = "") -> CompileLog:
    """``warmup`` on the CUDA ``device`` after seeding Triton's cache with ``files`` (binaries an
    earlier build exported: Triton loads them instead of compiling). Binaries that cannot be used
    are warned about and compiled instead: a stored build never fails a new one."""
    import torch

    if files:
        try:
            seed(files)
        except (BadBinaries, OSError) as e:
            warnings.warn(f"{name}: stored Triton binaries not used ({e})", stacklevel=3)
    with torch.cuda.device(device):  # compiled now, never inside a CUDA-graph capture
        return warmup(tm, module, launch)


def warmup(tm, module, launch: dict[str, Launch] | None = None, target=None) -> CompileLog:
    """Compile or load every kernel of the rendered module ``tm`` (imported as ``module``) with its
    launch configuration, without launching; returns what Triton did. ``target``: a ``GPUTarget``
    to build for on a machine without that GPU (the active driver is swapped for the call and
    restored; do not launch Triton kernels in other threads meanwhile)."""
    fns = [getattr(module, s.name) for s in tm.kernels]
    with contextlib.ExitStack() as stack:
        if target is not None:
            from triton.runtime.driver import driver

            previous = driver._active
            driver.set_active(_TargetDriver(target))
            stack.callback(setattr, driver, "_active", previous)
        log = stack.enter_context(watch(fns))
        for fn, s in zip(fns, tm.kernels):
            run = Launch.of((launch or {}).get(s.name) or Launch(s.num_warps, s.num_stages))
            kernel = fn.warmup(*_dtypes(tm, s), grid=s.grid, num_warps=run.num_warps, num_stages=run.num_stages,
                               **launch_options(tm.pdl))
            log.hashes[s.name] = kernel.hash
            if kernel.hash not in _SEEN:   # a Triton whose listener does not report cache hits
                _capture(kernel.hash, getattr(kernel, "metadata_group", None) or {})
    return log
