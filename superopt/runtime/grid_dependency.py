"""Programmatic dependent launch (sm_90+): a kernel's launch overlaps the tail of the one before it.

A decode step is hundreds of small kernels back to back. Between two of them the GPU idles while the
second is launched and its blocks are scheduled (about a microsecond, in a CUDA-graph replay too). With
programmatic dependent launch (PDL) a kernel launched with the attribute may be scheduled as soon as
every block of its predecessor has signalled ``griddepcontrol.launch_dependents`` (or exited); it then
waits in ``griddepcontrol.wait`` until the predecessor has completed and its writes are visible.

It is done one way. ``applies(device, enabled)`` decides (a CUDA GPU of sm_90+, kernels compiled, a
Triton that has the instructions, and the caller's switch: ``PatchOptions.pdl``). A kernel that is
launched so waits by construction: the renderer writes the wait, then the signal, before every
kernel's first load or store (``codegen.triton.render_triton(pdl=True)``), and the hand-written
attention kernels take a ``PDL`` constexpr. The launch then adds ``launch_options(True)``.

Waiting before any load or store is what keeps it safe next to any neighbour: the kernel reads and writes
nothing before its predecessor is complete, so a predecessor that never signals (a torch or cuBLAS
kernel) is simply waited for, and a successor launched without the attribute is ordered by the stream
as always. Signalling right after the wait lets the next kernel's blocks be resident, launched and
waiting, when this one ends; at most two kernels are in flight.

That order gives one more guarantee, which a kernel may use to start early: when a kernel launched so
begins, its predecessor has passed its own wait, so everything launched two or more places before it is
complete and its writes are visible. Memory that neither of the two launches before it writes may be
*read* before the wait (never written). The hand-written decode attention
(``mirage_serve/decode/attention_kernels.py``) loads its first cache tile that way, the slots of earlier
steps, while the q / k / v projection it waits for still runs. A generated kernel of at most 256 blocks
asks L2 for its first tile of each weight before its wait (PTX ``prefetch.global.L2``: a hint, neither a load
nor a store, harmless on any line; ``codegen.triton._weights_to_l2``). Both instructions are no-ops in a
kernel launched without the attribute (``torch.compile``'s launches), so the same binary serves
either launch.
"""
from __future__ import annotations

import functools

from .interpreter import interpreting

MIN_ARCH = 90  # griddepcontrol is a Hopper instruction


def supported(arch: int, enabled: bool = True) -> bool:
    """Whether kernels for a GPU of compute capability ``arch`` (90 for sm_90) use programmatic
    dependent launch: the GPU has it and the caller did not switch it off."""
    return bool(enabled) and arch >= MIN_ARCH


def applies(device, enabled: bool = True) -> bool:
    """Whether kernels built for the torch ``device`` use PDL: ``enabled``, a CUDA GPU of sm_90+,
    kernels compiled (not run by Triton's interpreter), a Triton that has the instructions."""
    return (bool(enabled) and device.type == "cuda" and not interpreting() and _triton_has_it()
            and supported(_arch(device)))


def launch_options(pdl: bool) -> dict:
    """Extra launch (and warm-up: compile options must match) options of a kernel rendered with
    ``pdl`` (its first statements wait for the predecessor)."""
    return {"launch_pdl": True} if pdl else {}


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
