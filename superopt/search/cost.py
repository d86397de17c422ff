"""The cost model that ranks verified μGraphs until GPU profiling (the codegen issue) measures them.

Estimated microseconds per call, summed over kernels (every node but views is a launch):

    t_kernel = LAUNCH_US + max(bytes / BANDWIDTH, flops / FLOPS) / parallel_efficiency

* bytes: every tensor a kernel reads, once, plus ``REREAD`` of it again for every further block
  that reads the same tile (replicated along a grid axis; such re-reads mostly hit L2); outputs
  once, or once per contributing block when blocks are summed (atomic partial writes). A read
  counts whole 32-byte sectors (``sector_waste``): a block tile narrower than a sector along the
  source's contiguous dim loads the rest of each sector too, and a warp's scattered loads stall
  it. The split-KV combine kernels the search offered on a grid over the head dim read their
  partials one float a row, 8× the bytes, and lost 3 µs of 14 to those on a grid over the heads
  (H100, session 31); writes are left at their bytes (they retire without stalling a warp).
* parallel_efficiency: how well the blocks fill the SMs — blocks / (waves · SMs) with
  waves = ⌈blocks / SMs⌉ — times the fraction of threads with work (tile elements / threads,
  capped at 1), times the fraction of the bandwidth the loads in flight can sustain. Library
  ops use blocks of 1024 elements.
* loads in flight (Little's law): an SM streams at full bandwidth only with about
  ``INFLIGHT_BYTES`` of loads outstanding (bandwidth × memory latency ÷ SMs). A block has one
  iteration's input tiles in flight; an SM holds the blocks resident on it at once. A decode GEMV
  tiled [4 columns, 256 of K] keeps 4 KB in flight per SM and was measured at 19% of the H200's
  bandwidth; [4, 1024] keeps 16 KB.
* tile size: a block tile of more than ``TILE_ELEMS`` elements as rendered (``tl.dot`` pads M and N
  to 16: a [16 columns, 1024 of K] weight tile, or 8 rows × 4 columns over K 1024) is a ``tl.dot``
  whose operands are staged in ~100–130 KB of shared memory, so one block fits an SM and a loop of
  a few iterations never fills its pipeline. Such designs tied within 3% with [4, 1024] ones here
  and were the cost model's pick for every Llama-3.1-8B decode projection, measured 1.2–4.6× slower
  on the H200 than the profiler's winners (≤ 4096 elements), whatever the warps the profiler
  launched them with (so not per thread); the efficiency is scaled by ``TILE_ELEMS / elements``.
* flops: 2·m·n·k per matmul element-tile product, 1 per elementwise element; tensor cores assumed.

Constants are those of an H100 SXM (sm_90): 132 SMs, 3.35 TB/s HBM3, ~400 TFLOP/s dense fp16.
They only order candidates; absolute values are not predictions. ``CostParams`` holds them; a
caller with GPU measurements passes fitted ones (``superopt.search.fit``: constants fitted to the
profiler's timings, stored per architecture as a small JSON by whoever keeps the kernel cache).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

from ..ir import DTYPE_BYTES, KernelGraph, Node, TensorType
from ..ir.graph import VIEW_OPS
from ..ir.movement import view_shape
from ..ir.padding import padded_shapes

SMS = {"sm_90": 132, "sm_89": 128, "sm_80": 108}
BANDWIDTH = 3.35e12   # bytes / s
FLOPS = 4.0e14        # flop / s
LAUNCH_US = 2.5
REREAD = 0.1
INFLIGHT_BYTES = 16 * 1024   # per SM: 3.35 TB/s × ~650 ns of loaded-memory latency ÷ 132 SMs
MAX_THREADS_PER_SM = 2048
TILE_ELEMS = 8192      # the largest block tile that runs well (FMA_MAX_ELEMS: 64 elements a thread at 4 warps)


@dataclass(frozen=True)
class CostParams:
    """The model's constants (module docstring); the defaults are the hand-set H100 values."""

    bandwidth: float = BANDWIDTH
    flops: float = FLOPS
    launch_us: float = LAUNCH_US
    reread: float = REREAD
    inflight_bytes: float = INFLIGHT_BYTES
    tile_elems: float = TILE_ELEMS
    # how many SMs' even share of the bandwidth one busy SM can draw: 1 charges a grid of half a wave
    # twice the time (wave quantization); above 1, fewer blocks than SMs can still stream at full rate
    sm_share: float = 1.0

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "CostParams":
        names = {f.name for f in fields(CostParams)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"CostParams: unknown constants {sorted(unknown)}")
        vals = {k: float(v) for k, v in d.items()}
        bad = [k for k, v in vals.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"CostParams: constants must be positive and finite: {sorted(bad)}")
        return CostParams(**vals)


DEFAULT_PARAMS = CostParams()


def load_params(path, arch: str) -> CostParams | None:
    """The constants fitted for ``arch`` in the JSON file ``path`` ({arch: {"params": {...}, ...}}),
    or None when the file or the arch is absent."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    entry = data.get(arch) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict):
        return None
    return CostParams.from_json(entry["params"])


def _bytes(t: TensorType) -> int:
    return t.numel * DTYPE_BYTES[t.dtype]


SECTOR_BYTES = 32  # the unit an SM loads from L2 / DRAM in


def sector_waste(tile: tuple[int, ...], src: tuple[int, ...], dtype: str) -> float:
    """Sectors an SM loads for ``tile`` out of a row-major ``src``, over the fewest that hold its bytes.
    The tile's contiguous runs (its trailing dims while they span the whole source dim, times the
    first that does not) each start a sector: a tile one float wide, taken across 64 columns, loads
    8× its bytes. A tile smaller than a sector is one sector either way (no waste)."""
    run = 1
    for t, s in zip(reversed(tile), reversed(src)):
        run *= t
        if t < s:
            break
    elems, size = math.prod(tile), DTYPE_BYTES[dtype]
    sectors = (elems // run) * math.ceil(run * size / SECTOR_BYTES)
    return sectors / math.ceil(elems * size / SECTOR_BYTES)


def _efficiency(blocks: int, sms: int, sm_share: float = 1.0) -> float:
    waves = math.ceil(blocks / sms)
    if waves == 1:  # one partial wave: its SMs may draw more than their even share (sm_share)
        return min(1.0, blocks * sm_share / sms)
    return blocks / (waves * sms)


def streaming_fraction(blocks: int, block_threads: int, tile_bytes: float, sms: int,
                       inflight_bytes: float = INFLIGHT_BYTES) -> float:
    """Fraction of the bandwidth that ``blocks`` blocks, each with ``tile_bytes`` of loads in
    flight, can sustain on the SMs they occupy (see module docstring)."""
    resident = min(max(1.0, blocks / sms), MAX_THREADS_PER_SM // block_threads)
    return min(1.0, resident * tile_bytes / inflight_bytes)


def _largest_padded(b, unpadded: int) -> int:
    """Elements of the block's largest tile as the Triton renderer holds it (``tl.dot`` operands
    padded to 16: an 8-row × 4-column GEMV tile of K 1024 is a [16, 1024] dot operand)."""
    try:
        shapes = padded_shapes(b, strict=False)
    except (ValueError, KeyError):  # a block only the CUDA renderer takes
        return unpadded
    return max([unpadded] + [math.prod(s) for s in shapes.values()])


def graph_cost(g: KernelGraph, arch: str = "sm_90", params: CostParams | None = None) -> float:
    """Estimated µs for one call of ``g`` (see module docstring); ``params``: fitted constants."""
    return sum(node_cost(n, [g.type_of(a) for a in n.args], arch, params) for n in g.nodes)


def node_cost(n: Node, args: list[TensorType], arch: str = "sm_90", params: CostParams | None = None) -> float:
    """Estimated µs of one kernel-graph node with operand types ``args`` (0 for views)."""
    f = features(n, args, arch)
    return 0.0 if f is None else cost_of(f, params or DEFAULT_PARAMS)


def cost_of(f: dict, p: CostParams) -> float:
    """``node_cost`` from a node's ``features`` and the constants ``p`` (what a fit varies)."""
    eff = (_efficiency(f["blocks"], f["sms"], p.sm_share) * f["threads_busy"]
           * min(1.0, p.tile_elems / f["largest_padded"])
           * (1.0 if f["library"] else min(1.0, f["resident"] * f["tile_bytes"] / p.inflight_bytes)))
    nbytes = f["bytes"] + p.reread * f["reread_bytes"]
    return p.launch_us + max(nbytes / p.bandwidth, f["flops"] / p.flops) * 1e6 / max(eff, 1e-6)


def features(n: Node, args: list[TensorType], arch: str = "sm_90") -> dict | None:
    """What ``node_cost`` combines with the constants, for one node (None for views): bytes read
    and written once, bytes re-read by further blocks, flops, blocks and SMs, the fraction of threads
    with work, the largest tile as rendered, one iteration's loads and the blocks resident an SM."""
    sms = SMS.get(arch, 132)
    if n.op in VIEW_OPS:
        return None
    if n.block is None:
        nbytes = sum(_bytes(t) for t in args) + _bytes(n.out.type)
        flops = n.out.type.numel * (2 * args[0].shape[-1] if n.op == "matmul" else 1)
        return dict(bytes=nbytes, reread_bytes=0.0, flops=flops, blocks=max(1, math.ceil(n.out.type.numel / 1024)),
                    sms=sms, threads_busy=1.0, largest=1, largest_padded=1, tile_bytes=0.0, resident=1.0,
                    library=True)
    b = n.block
    blocks = b.num_blocks
    nbytes, reread = 0.0, 0.0
    for inp in b.inputs:
        repl = 1
        for a in range(3):
            if inp.imap[a] == -1:
                repl *= b.grid[a]
        src = args[inp.source] if not inp.view else TensorType(view_shape(args[inp.source].shape, inp.view),
                                                               args[inp.source].dtype)
        loaded = _bytes(src) * sector_waste(inp.value.type.shape, src.shape, src.dtype)
        nbytes += loaded
        reread += loaded * (repl - 1)
    for o, v in zip(b.outputs, n.outs):
        partial = 1
        if o.reduce == "sum":
            partial = math.prod(b.grid[a] for a in range(3) if o.omap[a] == -1)
        nbytes += _bytes(v.type) * partial
    flops, largest = 0, 1
    tile_types = {i.value.name: i.value.type for i in b.inputs}
    for bn in b.nodes:
        tile_types[bn.out.name] = bn.out.type
        largest = max(largest, bn.out.type.numel)
        k = tile_types[bn.args[0]].shape[-1] if bn.op == "matmul" else 1
        runs = b.forloop if bn.op == "matmul" or bn.op.startswith("accum") else 1
        flops += 2 * k * bn.out.type.numel * runs if bn.op == "matmul" else bn.out.type.numel * runs
    f = dict(bytes=nbytes, reread_bytes=reread, flops=flops * blocks, blocks=blocks, sms=sms, largest=largest, library=False,
             largest_padded=_largest_padded(b, largest),
             tile_bytes=float(sum(_bytes(inp.value.type) for inp in b.inputs)))  # one iteration's loads
    return with_threads(f, b.block_threads)


def with_threads(f: dict, block_threads: int) -> dict:
    """``features`` of the same block launched with ``block_threads`` threads (nothing else in them
    depends on the thread count, so the search costs each thread count without re-deriving them)."""
    if f["library"]:
        return f
    return dict(f, threads_busy=min(1.0, f["largest"] / block_threads),
                resident=min(max(1.0, f["blocks"] / f["sms"]), MAX_THREADS_PER_SM // block_threads))
