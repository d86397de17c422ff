"""Build rendered Triton modules: write the source to a file, import it, register custom ops.

Triton's ``@jit`` reads a kernel's source with ``inspect``, so generated code must live in a real
file; it goes to a content-addressed path (name + hash of the source), written atomically, so
several processes may build the same module at once. Each launcher becomes a ``torch.library``
custom op through ``triton_op``, which keeps the kernels opaque-but-traceable under
``torch.compile``. Everything is memoised per process by content hash.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
from torch.library import triton_op

from ..codegen.triton import KernelSpec, TritonModule
from .fast_launch import direct_launches, launch_wrapper
from .grid_dependency import launch_options
from .interpreter import interpreting

_MODULES: dict[str, ModuleType] = {}
_OPS: dict[str, Callable] = {}
OP_NAMESPACE = "superopt_triton"


def default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"superopt-triton-{os.getuid() if hasattr(os, 'getuid') else 0}"


def source_key(tm: TritonModule) -> str:
    return _source_hash(tm.source)


def _source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def load_module(tm: TritonModule, cache_dir: str | Path | None = None) -> ModuleType:
    """Import the module ``tm`` renders (memoised by source hash)."""
    return load_source(tm.name, tm.source, tm.pdl, cache_dir)


def load_source(name: str, source: str, pdl: bool = False, cache_dir: str | Path | None = None) -> ModuleType:
    """Import generated module text ``source`` as ``name`` (memoised by source hash); ``pdl``: its launchers
    launch with programmatic dependent launch."""
    key = _source_hash(source)
    if key in _MODULES:
        return _MODULES[key]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_{key}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    modname = f"superopt_gen_{name}_{key}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod  # triton resolves globals of jitted functions through the module
    spec.loader.exec_module(mod)
    if not interpreting():  # direct launches reuse the compiled kernel (fast_launch's docstring)
        mod.wrap_triton = functools.partial(launch_wrapper, options=launch_options(pdl))
    _MODULES[key] = mod
    return mod


class KernelOp:
    """Launches one kernel: through its torch custom op while ``torch.compile`` traces (so the
    kernel stays one opaque, traceable node), directly otherwise. The dispatcher costs tens of µs
    per call in eager mode (measured ~50 µs on a loaded 2-core CPU), a kernel's whole budget at
    decode sizes; inside a captured CUDA graph neither path costs anything per replay.

    A direct call also turns ``wrap_triton`` off, as ``triton_op`` does for its own eager calls:
    left on, the launcher's ``wrap_triton(kernel)[grid](...)`` goes through torch's
    triton-kernel higher-order op (pytree flattening, signature binding) on every launch — on the
    H200 machine that made the patched Qwen2.5-0.5B's kernels-alone step 0.46× of eager (0.83×
    without it). Off, it resolves to ``fast_launch.FastLaunch``, which also skips Triton's own
    per-launch binding."""

    __slots__ = ("launch", "op")

    def __init__(self, launch: Callable, op: Callable):
        self.launch, self.op = launch, op

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.op(*args)
        with direct_launches():
            return self.launch(*args)


def kernel_op(tm: TritonModule, spec: KernelSpec, cache_dir: str | Path | None = None) -> KernelOp:
    """The launcher of ``spec``'s kernel, registered as torch custom op ``superopt_triton::<kernel>_<hash>``."""
    name = f"{OP_NAMESPACE}::{spec.name}_{source_key(tm)}"
    if name not in _OPS:
        fn = getattr(load_module(tm, cache_dir), spec.launcher)
        mutated = [p for p in spec.params() if not p.startswith("a")]
        _OPS[name] = KernelOp(fn, triton_op(name, mutates_args=tuple(mutated))(fn))
    return _OPS[name]
