"""Programmatic dependent launch (sm_90+): a kernel's launch overlaps the tail of the one before it.

A decode step is hundreds of small kernels back to back. Between two of them the GPU idles while the
second is launched and its blocks are scheduled (about a microsecond, in a CUDA-graph replay too). With
programmatic dependent launch (PDL) a kernel launched with the attribute may be scheduled as soon as
every block of its predecessor has signalled ``griddepcontrol.launch_dependents`` (or exited); it then
waits in ``griddepcontrol.wait`` until the predecessor has completed and its writes are visible.

``with_grid_dependency(source)`` makes the wait, then the signal, the first statements of every
``@triton.jit`` kernel of a generated module. Waiting before anything else is what keeps it safe next
to any neighbour: the kernel reads and writes nothing before its predecessor is complete, so a
predecessor that never signals (a torch or cuBLAS kernel) is simply waited for, and a successor
launched without the attribute is ordered by the stream as always. Signalling right after the wait
lets the next kernel's blocks be resident, launched and waiting, when this one ends; at most two
kernels are in flight. Both instructions are no-ops in a kernel launched without the attribute
(``torch.compile``'s launches), so the same binary serves either launch.

``launch_options(fn)`` is what a launch (and a warm-up, whose compile options must match it) adds for
a kernel that carries the wait: ``{"launch_pdl": True}``.
"""
from __future__ import annotations

import functools
import re

WAIT = "tl.extra.cuda.gdc_wait()"
SIGNAL = "tl.extra.cuda.gdc_launch_dependents()"
MIN_ARCH = 90  # griddepcontrol is a Hopper instruction
_enabled = True
# the header of a generated kernel: the decorator, then a one-line signature
_KERNEL = re.compile(r"^(@triton\.jit\ndef \w+\(.*\):\n)(?!    " + re.escape(WAIT) + ")", re.MULTILINE)


def with_grid_dependency(source: str) -> str:
    """``source`` with every kernel waiting for its predecessor, then signalling its successor,
    before its first statement; a kernel that already does is left as it is."""
    return _KERNEL.sub(lambda m: f"{m.group(1)}    {WAIT}\n    {SIGNAL}\n", source)


def set_enabled(on: bool) -> None:
    """Whether kernels built (and decode attention launched) from now on use PDL; on by default."""
    global _enabled
    _enabled = bool(on)


def supported(arch: int) -> bool:
    """Whether kernels for a GPU of compute capability ``arch`` (90 for sm_90) use programmatic
    dependent launch: the GPU has it and it is not switched off (``set_enabled``)."""
    return _enabled and arch >= MIN_ARCH


def applies(device) -> bool:
    """Whether kernels built for the torch ``device`` use PDL: a CUDA GPU of sm_90+, kernels compiled
    (not run by Triton's interpreter), PDL not switched off."""
    from .build import interpreting

    return device.type == "cuda" and not interpreting() and _triton_has_it() and supported(_arch(device))


@functools.lru_cache(maxsize=None)
def _triton_has_it() -> bool:
    """Triton ≥ 3.4 has the two instructions and the ``launch_pdl`` option; an older one builds without."""
    import triton.language as tl

    return hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")


@functools.lru_cache(maxsize=None)
def _arch(device) -> int:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def launch_options(fn) -> dict:
    """Extra launch (and warm-up) options of the Triton JIT function ``fn``: PDL where it waits."""
    return {"launch_pdl": True} if WAIT in getattr(fn, "src", "") else {}
