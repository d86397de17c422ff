"""Launch a compiled Triton kernel again without Triton's per-call argument binding.

``JITFunction.run`` (what ``kernel[grid](...)`` calls) binds and specialises every argument and
looks the compiled kernel up on each launch: tens of µs of Python, several times the kernel itself
for a decode GEMV. A generated launcher always passes the same kinds of arguments (tensors only,
the same launch options), so the first launch through Triton is kept: its ``CompiledKernel`` is
reused for every later launch whose arguments specialise the same way. For tensor arguments
Triton specialises on the dtype and on whether the address is 16-byte aligned; both are in the
key, so an activation that arrives misaligned takes Triton's path (and gets its own kernel).

Used only for direct (eager) launches: while ``torch.compile`` traces, a launcher's
``wrap_triton`` stays torch's (``launch_wrapper``). Not installed under ``TRITON_INTERPRET``.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

from torch.library import wrap_triton

try:  # torch's switch for wrap_triton (private: without it, eager launches keep torch's wrapper)
    from torch._library.triton import is_wrap_triton_enabled, set_wrap_triton_enabled
except ImportError:  # pragma: no cover
    set_wrap_triton_enabled = None

    def is_wrap_triton_enabled() -> bool:
        return True


def direct_launches():
    """Context for a direct (eager) launch: ``wrap_triton(kernel)`` in a launcher resolves to a
    ``FastLaunch``, as ``triton_op`` turns the wrapper off for its own eager calls."""
    if set_wrap_triton_enabled is None:
        return contextlib.nullcontext()
    return set_wrap_triton_enabled(False)

_SLOW = object()  # a key whose launch returned no reusable CompiledKernel: always Triton's path


class FastLaunch:
    """``FastLaunch(kernel, options)[grid](*tensors, num_warps=w, num_stages=s)``, as
    ``kernel[grid](..., **options)``. ``options``: the module's launch options (``launch_pdl`` for
    kernels rendered waiting for their predecessor, ``grid_dependency``): compile options, so the
    first launch's CompiledKernel launches every later one with them."""

    __slots__ = ("kernel", "_runners", "_options")

    def __init__(self, kernel, options: dict | None = None):
        self.kernel = kernel
        self._runners: dict[tuple, Any] = {}
        self._options = dict(options or {})

    def __getitem__(self, grid):
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, num_warps: int, num_stages: int) -> None:
        key = (grid, num_warps, num_stages, args[0].device,
               tuple((a.dtype, a.data_ptr() % 16 == 0) for a in args))
        run = self._runners.get(key)
        if run is None or run is _SLOW:
            compiled = self.kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **self._options)
            if run is None:
                # ``CompiledKernel[grid]`` launches on the current stream (so CUDA-graph capture
                # records it) with exactly the arguments given: no binding, no lookup.
                self._runners[key] = compiled[grid] if hasattr(compiled, "__getitem__") else _SLOW
            return
        run(*args)


_FAST: dict[int, FastLaunch] = {}


def launch_wrapper(kernel, options: dict | None = None):
    """What a generated launcher's ``wrap_triton(kernel)`` resolves to (``build.load_module``
    installs it, with the module's launch ``options``): torch's wrapper while tracing, a
    ``FastLaunch`` for direct launches."""
    if is_wrap_triton_enabled():
        return wrap_triton(kernel)
    fast = _FAST.get(id(kernel))
    if fast is None or fast.kernel is not kernel:
        fast = _FAST[id(kernel)] = FastLaunch(kernel, options)
    return fast
