"""Whether a launch's tiles fit a thread's registers well enough to be worth building.

Triton keeps a block's tiles in registers, spread over its threads: a padded tile of E elements on
``num_warps`` warps is E / (32 · num_warps) values a thread. Past a few hundred the build spills
tens of KB a thread to local memory, and ptxas' time grows about 3× each time the tile doubles: the
search's nTrans b8 designs holding 32–64 whole rows of 4096 a block compiled for sm_90 in 10–143 s
a launch (Triton 3.9, on a CPU, AOT; 1024–4096 values a thread), which held the block benchmark's
row past its time limit in four sessions, while every launch that has won a row holds at most 256
(o+res b8: a [32, 512] weight tile on 2 warps). Launches above ``MAX_VALUES_PER_THREAD`` are not
built; the profiler times everything else and decides.
"""
from __future__ import annotations

import math

from .graph import BlockGraph, KernelGraph
from .padding import padded_shapes

MAX_VALUES_PER_THREAD = 512


def values_per_thread(b: BlockGraph, num_warps: int) -> int:
    """The largest padded tile of ``b`` (an input or a node's value) over the threads of ``num_warps``."""
    largest = max((math.prod(s) for s in padded_shapes(b, strict=False).values()), default=0)
    return -(-largest // (32 * num_warps))


def registers_fit(g: KernelGraph, num_warps: int | None = None) -> bool:
    """Whether every customized op of ``g`` holds at most ``MAX_VALUES_PER_THREAD`` values a thread at
    ``num_warps`` (None: each kernel's default, its block's threads / 32, as the renderer launches it)."""
    return all(values_per_thread(n.block, num_warps or max(1, n.block.block_threads // 32)) <= MAX_VALUES_PER_THREAD
               for n in g.customized_nodes())
