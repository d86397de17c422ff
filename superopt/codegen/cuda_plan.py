"""Where each block value of a customized op lives in the CUDA kernel: global, shared or registers.

The plan for one block graph decides, before any text is written:

* input tiles: *staged* in shared memory in their own dtype (16-byte ``cp.async`` copies when the
  tile rows are 16-byte aligned, double-buffered across for-loop iterations when that fits), or
  read straight from global memory when their only readers are GEMV matmuls (weights are read
  once; staging them would cost shared memory and a barrier for nothing);
* GEMV matmuls: ``[M,K] @ [K,N]`` with M ≤ 16 and the rhs a global tile — warps stream the rhs
  with 16-byte loads, each thread keeps M×V float32 partial sums in registers; a GEMV whose only
  reader is an ``accum_sum`` keeps its registers across the whole for-loop and writes the
  accumulator once after it;
* every other value: inline (thread-group members and constants, recomputed in registers where
  read) or a float32 shared-memory tile.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

from ..ir import BlockGraph, Node, Variance, block_variance
from ..ir.ops import ACCUM_OPS, DTYPE_BYTES

SMEM_LIMIT = 227 * 1024  # sm_90 dynamic shared memory per block after the opt-in
GEMV_MAX_M = 16
GEMV_MAX_REGS = 128      # M × V float32 partial sums per thread


class CudaRenderError(ValueError):
    """The μGraph is valid but this renderer cannot express it (says what and why)."""


@dataclass
class InputPlan:
    name: str
    source: int
    dtype: str
    tile: tuple[int, ...]
    src_shape: tuple[int, ...]
    imap: tuple[int, int, int]
    fmap: int
    staged: bool = True
    vec: int = 1             # elements per 16-byte vector; 1: scalar copies
    double: bool = False     # two shared-memory buffers, the next iteration prefetched by cp.async
    smem_off: int = -1


@dataclass
class GemvPlan:
    node: Node
    a: str                   # lhs value [M, K]
    b: str                   # rhs global input tile [K, N]
    M: int
    K: int
    N: int
    V: int                   # columns per 16-byte load
    KS: int                  # K slices: threads per column group
    into_accum: str | None   # the accum_sum this GEMV feeds directly, if any

    @property
    def CG(self) -> int:
        return self.N // self.V

    @property
    def KC(self) -> int:
        return -(-self.K // self.KS)


@dataclass
class BlockPlan:
    block: BlockGraph
    var: dict[str, str]
    nodes: dict[str, Node]
    inputs: dict[str, InputPlan]
    inline: set[str]
    gemv: dict[str, GemvPlan]                 # by matmul result name
    smem_off: dict[str, int] = field(default_factory=dict)   # float32 tiles
    prev_max: dict[str, int] = field(default_factory=dict)   # accum_max -> offset of its copy
    smem_bytes: int = 0

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.inputs:
            return self.inputs[name].tile
        return self.nodes[name].out.type.shape

    def consumers(self, name: str) -> list[Node]:
        return [n for n in self.block.nodes if name in n.args]


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def vector_width(p: InputPlan, grid: tuple[int, int, int]) -> int:
    """Elements per 16-byte vector if every tile row starts 16-byte aligned in global memory.

    Row starts are multiples of the source's last dim; within the last dim a tile starts at
    b·(S/g) + i·(S/(g·f)), so S, S/g and the tile width must all be multiples of the vector.
    """
    v = 16 // DTYPE_BYTES[p.dtype]
    last = len(p.src_shape) - 1
    g = next((grid[a] for a in range(3) if p.imap[a] == last), 1)
    if p.tile[last] % v or p.src_shape[last] % v or (p.src_shape[last] // g) % v:
        return 1
    return v


def plan_block(b: BlockGraph, arg_shapes: list[tuple[int, ...]]) -> BlockPlan:
    for t in [i.value.type for i in b.inputs] + [n.out.type for n in b.nodes]:
        if t.dtype == "float64":
            raise CudaRenderError("float64 block values are not rendered to CUDA (compute is float32)")
    viewed = [i.value.name for i in b.inputs if i.view]
    if viewed:  # data movement (ir/movement.py) is rendered by the Triton backend only
        raise CudaRenderError(f"block inputs read through a view (slice offset / head repeat): "
                              f"{', '.join('%' + v for v in viewed)}; use the Triton backend")
    var = block_variance(b)
    nodes = {n.out.name: n for n in b.nodes}
    inputs: dict[str, InputPlan] = {}
    for i in b.inputs:
        p = InputPlan(i.value.name, i.source, i.value.type.dtype, i.value.type.shape,
                      tuple(arg_shapes[i.source]), i.imap, i.fmap)
        p.vec = vector_width(p, b.grid)
        inputs[p.name] = p
    inline = {x for grp in b.thread_groups for x in grp}
    inline |= {n.out.name for n in b.nodes if n.op == "const"}
    plan = BlockPlan(b, var, nodes, inputs, inline, {})
    for n in b.nodes:
        g = _gemv(plan, n)
        if g is not None:
            plan.gemv[n.out.name] = g
    for name, p in inputs.items():
        p.staged = not _only_gemv_rhs(plan, name)
        p.double = p.staged and p.fmap != -1 and p.vec > 1 and b.forloop > 1
    _layout(plan)
    return plan


def widened_input(plan: BlockPlan, name: str) -> str | None:
    """The input tile that ``name`` is, possibly through inline casts to float32 (exact widening:
    every tile is loaded to float32 anyway), or None."""
    while name not in plan.inputs:
        n = plan.nodes.get(name)
        if n is None or n.op != "cast" or n.attr("dtype") != "float32" or name not in plan.inline:
            return None
        name = n.args[0]
    return name


def _only_gemv_rhs(plan: BlockPlan, name: str) -> bool:
    """Whether every reader of ``name`` (through inline widening casts) is a GEMV's rhs operand."""
    if any(o.value == name for o in plan.block.outputs):
        return False
    readers = plan.consumers(name)
    if not readers:
        return False
    for r in readers:
        if r.out.name in plan.gemv and r.args[1] == name and r.args[0] != name:
            continue
        if r.op == "cast" and widened_input(plan, r.out.name) is not None and _only_gemv_rhs(plan, r.out.name):
            continue
        return False
    return True


def _gemv(plan: BlockPlan, n: Node) -> GemvPlan | None:
    if n.op != "matmul":
        return None
    a, bname = n.args
    src = widened_input(plan, bname)
    rhs = plan.inputs.get(src) if src else None
    if rhs is None or len(rhs.tile) != 2 or len(plan.shape(a)) != 2:
        return None
    (M, K), (_, N) = plan.shape(a), rhs.tile
    if M > GEMV_MAX_M or M * rhs.vec > GEMV_MAX_REGS:
        return None
    cg = N // rhs.vec
    ks = max(1, plan.block.block_threads // cg) if cg <= plan.block.block_threads else 1
    ks = -(-K // -(-K // min(ks, K)))  # drop slices that would start past K
    readers = plan.consumers(n.out.name)
    into = None
    if (len(readers) == 1 and readers[0].op == "accum_sum" and cg <= plan.block.block_threads
            and not any(o.value == n.out.name for o in plan.block.outputs)
            and plan.var[n.out.name] == Variance.LOOP):
        into = readers[0].out.name
    return GemvPlan(n, a, src, M, K, N, rhs.vec, ks, into)


def _layout(plan: BlockPlan) -> None:
    """Assign shared-memory offsets; drop double buffering, then staging, until the tiles fit."""
    def total() -> int:
        off = 0
        for p in plan.inputs.values():
            if p.staged:
                off += _align16(math.prod(p.tile) * DTYPE_BYTES[p.dtype]) * (2 if p.double else 1)
        for name in _smem_values(plan):
            off += _align16(math.prod(plan.shape(name)) * 4)
        for m in _rescaled_maxes(plan):
            off += _align16(math.prod(plan.shape(m)) * 4)
        return off

    for p in sorted(plan.inputs.values(), key=lambda p: -math.prod(p.tile)):
        if total() <= SMEM_LIMIT:
            break
        p.double = False
    for p in sorted(plan.inputs.values(), key=lambda p: -math.prod(p.tile)):
        if total() <= SMEM_LIMIT:
            break
        if not any(o.value == p.name for o in plan.block.outputs):
            p.staged = False
    if total() > SMEM_LIMIT:
        raise CudaRenderError(f"block graph needs {total()} bytes of shared memory as float32 tiles; "
                              f"the CUDA renderer has {SMEM_LIMIT}")
    off = 0
    for p in plan.inputs.values():
        if p.staged:
            p.smem_off = off
            off += _align16(math.prod(p.tile) * DTYPE_BYTES[p.dtype]) * (2 if p.double else 1)
    for name in _smem_values(plan):
        plan.smem_off[name] = off
        off += _align16(math.prod(plan.shape(name)) * 4)
    for m in _rescaled_maxes(plan):
        plan.prev_max[m] = off
        off += _align16(math.prod(plan.shape(m)) * 4)
    plan.smem_bytes = off


def _smem_values(plan: BlockPlan) -> list[str]:
    """Node results held as float32 shared tiles: all but inline values and register-fed GEMVs."""
    return [n.out.name for n in plan.block.nodes
            if n.out.name not in plan.inline
            and not (n.out.name in plan.gemv and plan.gemv[n.out.name].into_accum)]


def _rescaled_maxes(plan: BlockPlan) -> list[str]:
    seen: list[str] = []
    for n in plan.block.nodes:
        if n.op == "accum_sum_rescaled" and n.args[1] not in seen:
            seen.append(n.args[1])
    return seen


def is_accum(n: Node) -> bool:
    return n.op in ACCUM_OPS

