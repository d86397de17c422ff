"""Backends that execute a μGraph on tensors: the torch interpreter (CPU) and compiled GPU kernels.

* ``torch``: ``superopt.interp.evaluate`` over a ``TorchDomain``: runs the μGraph exactly as
  tiled, with torch ops. Exact and slow; on CPU it gives **no speed-up** (it exists so the whole
  patch path runs and is tested without a GPU). Differentiable, like any torch code.
* ``triton``: ``superopt.runtime.compile_graph``; not differentiable, so a patched module falls
  back to its original forward when autograd needs a graph.
* ``auto``: ``triton`` when the model is on a CUDA device, else ``torch``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from superopt.ir import KernelGraph
from superopt.runtime.interpreter import interpreting

BACKENDS = ("auto", "torch", "triton")


class BackendError(ValueError):
    pass


def resolve(backend: str, device: torch.device) -> str:
    """The concrete backend for ``backend`` on ``device``; raises with the valid names."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend == "triton" and device.type != "cuda" and not interpreting():  # (the interpreter runs it on a CPU)
        raise BackendError(f"backend {backend!r} needs the model on a CUDA device; it is on {device} "
                           f"(use backend='torch' or 'auto' on CPU)")
    return backend


def arch_of(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    return "cpu"


def gpu_name(device: torch.device) -> str:
    """The GPU model's name (``NVIDIA H200``), what a cache entry's launch was timed on; "" off the GPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


@dataclass(frozen=True)
class Executor:
    """``run(*tensors)`` takes the μGraph's inputs in ``graph.inputs`` order, returns its outputs."""

    run: Callable[..., list]
    backend: str
    differentiable: bool
    compiled: int           # kernels compiled in this process (0: none, or all loaded from caches)
    seconds: float
    source: str | None = None   # generated source (triton), for the cache entry
    binaries: dict = field(default_factory=dict)  # compiled kernels as plain files, for the cache entry


def build(graph: KernelGraph, backend: str, device: torch.device, launch: dict | None = None,
          binaries: dict | None = None, *, pdl: bool = True, deterministic: bool = False) -> Executor:
    """``launch``: Triton kernel name -> ``Launch``, as profiled (default: the renderer's). ``pdl``:
    Triton kernels use programmatic dependent launch where the GPU has it (``PatchOptions.pdl``).
    ``deterministic``: Triton kernels that sum across blocks do so in a fixed order (``PatchOptions.deterministic``;
    the torch backend always does).
    ``binaries``: a signed cache entry's build (``mirage_serve.cache.builds``), so that a warm entry
    compiles nothing; the source that runs is always rendered from ``graph``."""
    t0 = time.perf_counter()
    if backend == "torch":
        from superopt.interp import evaluate
        from superopt.interp.torch_domain import TorchDomain

        domain = TorchDomain(device)
        return Executor(lambda *ts: evaluate(graph, ts, domain), "torch", True, 0,
                        time.perf_counter() - t0)
    if backend != "triton":
        raise BackendError(f"cannot build backend {backend!r}; resolve() gives torch or triton")
    from superopt.runtime import compile_graph  # triton: imported when a GPU build is asked for

    compiled = compile_graph(graph, backend="triton", device=device, launch=launch, binaries=binaries, pdl=pdl,
                             ordered_sums=deterministic)
    # Compiled graphs write their results into buffers that the next call overwrites, and one
    # graph serves the same site of every layer. No copy: a decoder layer consumes a site's outputs
    # (projections into RoPE / the KV cache / the residual add) before the next layer calls the
    # site again, and a copy per output would add a launch per output per layer to every step.
    # Nothing compiled from given binaries: Triton loaded exactly those (matched by its hash of the
    # source rendered here), so they are this build's; reading every cubin back from Triton's cache
    # (``binaries()``) would cost a warm patch a file read per kernel for nothing.
    built = binaries if binaries and not compiled.compiles else compiled.binaries()
    return Executor(compiled, backend, False, compiled.compiles, time.perf_counter() - t0,
                    compiled.source, built)

