"""A call counter advanced by the graph's last kernel: one launch fewer than a counter advanced after the graph.

A decode step's attention graph is followed by its cache's length advancing by one (HF's device-side
``cumulative_length``): a torch ``add_``, a launch of its own for every layer. The graph's last kernel can do it
instead: one of its blocks adds one to the counter when its work is done. That has the same effect at the same
point of the stream where nothing in that kernel or after it reads the counter. Every earlier kernel has
finished before the last one does anything: stream order, or, under programmatic dependent launch, its first
statement waits for its predecessor. The caller names the graph input the counter may be (the position that
indexes the cache writes, which is that counter itself). A kernel that reads that input cannot count: its other
blocks might read the advanced value.

This changes how the μGraph runs, not the μGraph: the counter is no tensor of the graph; the runtime hands it to
the kernel (``CompiledGraph(counter=…)``). docs/architecture.md ("Decode attention") says why it exists.
"""
from __future__ import annotations

from typing import Mapping

from ..ir import KernelGraph
from ..ir.graph import VIEW_OPS


def counting_kernel(g: KernelGraph, may_be: str, launched: Mapping[int, tuple[str, ...]],
                    inside: frozenset[int] = frozenset()) -> int | None:
    """The node index of the kernel that can count calls of ``g``, or None.

    ``launched`` maps each rendered kernel's node index to the graph tensors it reads (its arguments, with the
    slot index of a stored-through write and a chained consumer's). ``inside``: nodes that run inside another
    node's kernel (a chain's consumer). The candidate is the last kernel launched. It qualifies where it does not
    read ``may_be`` and every node after it launches nothing of its own (views, constants, ``inside``)."""
    if not launched:
        return None
    last = max(launched)
    if may_be in launched[last]:
        return None
    for idx in range(last + 1, len(g.nodes)):
        if idx not in inside and g.nodes[idx].op not in VIEW_OPS:
            return None
    return last
