"""The μGraph data types: kernel graphs, block (threadblock) graphs and their nodes, all frozen.

A *kernel graph* is a list of nodes over device tensors. A node is a library op (matmul,
elementwise, reduction, …) or a ``customized`` op that holds a *block graph*: the program one
threadblock runs. A Lax program is itself a kernel graph of library ops.

Block graph semantics (Mirage paper §3; docs/architecture.md):

* ``grid`` (x, y, z) threadblocks run the same block graph; ``forloop`` iterations run inside each.
* A block input reads a tile of kernel tensor ``args[source]`` (seen through ``view``, a slice
  offset or a head repeat, when it has one: ``ir.movement``). ``imap[a]`` names the tensor dim
  that grid axis ``a`` partitions (``-1``: the axis replicates). ``fmap`` names the dim the
  for-loop walks (``-1``: the same tile every iteration). A dim split by both is split first by
  the grid, then each block's chunk by the loop: index = b·(S/g) + i·(S/(g·f)) + j.
* Nodes that (transitively) read a for-loop-walked input are *loop-variant*; accumulators
  (``accum_*``) turn them into per-block results available after the loop. ``accum_max`` is also
  readable inside the loop, where it holds the running maximum (online softmax).
* A block output writes a loop-invariant tile. ``omap[a]`` names the output dim that grid axis
  ``a`` tiles (``-1``: the axis does not tile the output; then ``reduce="sum"`` must combine the
  blocks, e.g. by atomics or a second pass; with a grid extent of 1 no reduction is needed).
* ``thread_groups`` record thread-level fusion: each group is a chain of elementwise nodes kept in
  registers and never materialised in shared memory. Semantics do not depend on them; shared
  memory accounting and code generation do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

AttrValue = Union[int, float, str, tuple]
Attrs = tuple[tuple[str, AttrValue], ...]

GRID_AXES = ("x", "y", "z")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Value:
    """A named SSA value: a device tensor in a kernel graph, a tile in a block graph."""

    name: str
    type: TensorType


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[str, ...]
    outs: tuple[Value, ...]
    attrs: Attrs = ()
    block: "BlockGraph | None" = None  # only for op == "customized"

    @property
    def out(self) -> Value:
        if len(self.outs) != 1:
            raise ValueError(f"{self.op} node has {len(self.outs)} outputs; use .outs")
        return self.outs[0]

    def attr(self, key: str, default: AttrValue | None = None) -> AttrValue | None:
        for k, v in self.attrs:
            if k == key:
                return v
        return default


def make_attrs(**kwargs: AttrValue) -> Attrs:
    """Attributes in canonical (sorted) order, so equal nodes compare and print equal."""
    return tuple(sorted(kwargs.items()))


@dataclass(frozen=True)
class BlockInput:
    value: Value            # the tile, with its tile shape
    source: int             # index into the customized node's args
    imap: tuple[int, int, int]
    fmap: int
    # Index maps the operand is read through before tiling: a slice offset or a head repeat
    # (``ir.movement``); () reads the operand as it is.
    view: tuple = ()


@dataclass(frozen=True)
class BlockOutput:
    value: str              # a block value name
    omap: tuple[int, int, int]
    reduce: str = "none"    # "none" or "sum" (cross-block reduction over unmapped grid axes)


@dataclass(frozen=True)
class BlockGraph:
    grid: tuple[int, int, int]
    block_threads: int
    forloop: int
    inputs: tuple[BlockInput, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[BlockOutput, ...]
    thread_groups: tuple[tuple[str, ...], ...] = ()

    @property
    def num_blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclass(frozen=True)
class KernelGraph:
    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    name: str = "graph"
    _types: dict = field(default=None, compare=False, repr=False, hash=False)  # type: ignore[assignment]

    def type_of(self, name: str) -> TensorType:
        if self._types is None:
            table = {v.name: v.type for v in self.inputs}
            for n in self.nodes:
                table.update((v.name, v.type) for v in n.outs)
            object.__setattr__(self, "_types", table)
        try:
            return self._types[name]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no value named {name!r}") from None

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return tuple(self.type_of(o) for o in self.outputs)

    def customized_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op == "customized")

    @property
    def num_kernels(self) -> int:
        """Kernel launches: every node but constants and views (reshape, transpose, slice)."""
        return sum(1 for n in self.nodes if n.op not in VIEW_OPS)


VIEW_OPS = frozenset({"const", "reshape", "transpose", "slice"})
