"""Tiling patterns and kernel skeletons: μGraph structure without extents, JSON-serialisable.

A *pattern* names which program indices the grid axes partition, which index the for-loop walks
and which grid index is summed across blocks (a split kernel). A *skeleton* is the block graph a
search found for a pattern, with every tile shape left open: ``instantiate`` fills them in for
chosen grid / loop extents at any program shape (structure reuse). Constants refer to the
program's const nodes by position, so a skeleton found at one shape reads the right ``eps`` and
``1/n`` at another.
"""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    grid: tuple[int, ...]   # index id partitioned by grid axis x, y, z (0..3 axes)
    loop: int = -1          # index id the for-loop walks (-1: no loop)
    split: int = -1         # a grid index whose blocks are summed by cross-block reduction

    def key(self) -> str:
        return f"grid={list(self.grid)} loop={self.loop} split={self.split}"


@dataclass(frozen=True)
class KernelSkeleton:
    pattern: Pattern
    sources: tuple[str, ...]                               # device tensors the kernel reads, in arg order
    inputs: tuple[tuple[int, tuple[int, int, int], int], ...]  # (arg, imap, fmap) per block input
    nodes: tuple[tuple[str, tuple[int, ...], tuple], ...]  # (op, refs, attrs); refs: inputs then nodes
    outputs: tuple[tuple[int, tuple[int, int, int], str, str], ...]  # (ref, omap, reduce, device name)
    out_labels: tuple[tuple[int, ...], ...]                # index ids of each output's dims

    def to_json(self) -> dict:
        p = self.pattern
        return {"pattern": [list(p.grid), p.loop, p.split], "sources": list(self.sources),
                "inputs": [[a, list(i), f] for a, i, f in self.inputs],
                "nodes": [[op, list(r), [list(kv) for kv in at]] for op, r, at in self.nodes],
                "outputs": [[r, list(o), red, name] for r, o, red, name in self.outputs],
                "out_labels": [list(x) for x in self.out_labels]}

    @staticmethod
    def from_json(d: dict) -> "KernelSkeleton":
        g, loop, split = d["pattern"]
        return KernelSkeleton(
            Pattern(tuple(g), loop, split), tuple(d["sources"]),
            tuple((a, tuple(i), f) for a, i, f in d["inputs"]),
            tuple((op, tuple(r), tuple((k, _tup(v)) for k, v in at)) for op, r, at in d["nodes"]),
            tuple((r, tuple(o), red, name) for r, o, red, name in d["outputs"]),
            tuple(tuple(x) for x in d["out_labels"]))


def _tup(v):
    return tuple(_tup(x) for x in v) if isinstance(v, list) else v


Design = tuple  # tuple[KernelSkeleton, ...]: the kernels of one candidate μGraph, in launch order


def design_to_json(design: Design) -> list:
    return [k.to_json() for k in design]


def design_from_json(d: list) -> Design:
    return tuple(KernelSkeleton.from_json(k) for k in d)


def design_key(design: Design) -> str:
    return json.dumps(design_to_json(design), sort_keys=True)


def retarget(k: KernelSkeleton, pattern: Pattern, source_labels: dict[str, tuple[int, ...]]) -> KernelSkeleton:
    """The same block graph under a pattern that also partitions output indices by the grid.

    Output indices are never summed inside a kernel, so partitioning them changes which tile a
    block reads and writes (imap, omap) but not a single op: one search serves every such pattern."""
    def axes_map(labels):
        m = [-1, -1, -1]
        for a, idx in enumerate(pattern.grid):
            if idx in labels:
                m[a] = labels.index(idx)
        return (m[0], m[1], m[2])

    inputs = tuple((arg, axes_map(source_labels[k.sources[arg]]), fmap) for arg, _, fmap in k.inputs)
    outputs = tuple((ref, axes_map(lab), red, name) for (ref, _, red, name), lab in zip(k.outputs, k.out_labels))
    return KernelSkeleton(pattern, k.sources, inputs, k.nodes, outputs, k.out_labels)


def search_key(pattern: Pattern) -> Pattern:
    """The pattern whose search serves ``pattern`` (``retarget``): only the split stays on the grid."""
    return Pattern(tuple(i for i in pattern.grid if i == pattern.split), pattern.loop, pattern.split)
