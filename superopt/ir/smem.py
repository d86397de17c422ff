"""Shared memory a block graph needs as the Triton renderer writes it: one estimate for checker and runtime.

Triton keeps tiles in registers; shared memory holds only what its compiler stages there, all of
it at the *padded* tile shapes the renderer uses (``padding.padded_shapes``: powers of two, dot
dims ≥ 16). Measured against ``metadata.shared`` of sm_90 builds (tests/superopt/codegen/test_smem_estimate.py):

* **pipelined loads**: in a for-loop of ``num_stages`` > 1, a loop-variant load that (through
  elementwise ops, casts, transposes) feeds a ``tl.dot`` is copied ahead by ``cp.async`` into
  ``num_stages − 1`` buffers of its padded tile, in its dtype; all of them live the whole loop.
* **small-M matmuls** (``padding.fma_matmul``) are no ``tl.dot``: a broadcast product in registers
  and a ``tl.sum``, whose cross-warp reduction is scratch (below), as is the conversion of an
  operand to the product's layout (seen for a split-K block's [32, 16] weight tile: 2 KB float32).
* **dot operands**: a ``tl.dot`` operand that is not a pipelined load passed as loaded (no mask
  along K, no dtype conversion) is written to shared memory
  (layout conversion to the MMA operand layout): padded A + padded B in the dot's input dtype.
  The buffers of different dots are not live together (Triton reuses them): the largest counts,
  except loop-invariant operands of a dot in the loop, converted once before it and live all of
  it. An fp32 dot (IEEE, FMA) converts even a pipelined load into a buffer of its own.
* **scratch**: cross-warp reductions (one partial per output element and warp) and layout
  conversions of transposes (at most the whole float32 tile; a transpose with an extent-1 side is
  converted in chunks of ~1 KB a warp); transient, like dot operands.
* **stacked dots** (two few-row dots on one operand, their weight tiles run as one wgmma:
  ``codegen.triton_block._stacked_pairs``): the [2N, M] float32 sum is split back through shared memory after
  the loop, in a buffer of its own beside the dot's operand: a gated MLP's [32, 32] tiles took 15488 bytes at
  4 warps (wgmma) against 10368 at 2 (mma.sync), 1 KB for the operand and 4 KB for the split. Counted for every
  pair of dots with one first operand and the stacked shapes, a superset of the pairs the renderer stacks.

The estimate is the pipelined and loop-long buffers plus the largest transient one: an upper bound that
stays within 1.5× + 16 KB of what Triton allocates for every fixture and searched graph. A loop
without any dot is counted as if its loads were pipelined too (newer Triton may do so).
"""
from __future__ import annotations

import math

from .graph import BlockGraph
from .ops import DTYPE_BYTES, Category, op_info
from .padding import WGMMA_MIN_ROWS, fma_matmul, padded_shapes

# Usable shared memory per threadblock, bytes (sm_90: 227 KB after the opt-in; the launch limit
# Triton reports on H100/H200 is 232448).
SMEM_BUDGET = {"sm_90": 227 * 1024, "sm_89": 99 * 1024, "sm_80": 163 * 1024}
STAGE_CHOICES = (3, 2, 1)  # the renderer's default num_stages, most pipelined first


def dot_dtype(b: BlockGraph) -> str:
    """The dtype ``tl.dot`` operands take: the first fp16/bf16 of the kernel's inputs and outputs."""
    io = [i.value.type.dtype for i in sorted(b.inputs, key=lambda i: i.source)]
    dtypes = {n.out.name: n.out.type.dtype for n in b.nodes}
    dtypes.update((i.value.name, i.value.type.dtype) for i in b.inputs)
    io += [dtypes[o.value] for o in b.outputs]
    return next((d for d in io if d in ("float16", "bfloat16")), "float32")


def triton_smem_bytes(b: BlockGraph, num_warps: int | None = None, num_stages: int = 1) -> int:
    """Upper estimate of ``metadata.shared`` for the Triton kernel of ``b`` at this launch config."""
    num_warps = num_warps or max(1, b.block_threads // 32)
    pad = padded_shapes(b, strict=False)
    producer = {n.out.name: n for n in b.nodes}
    loop_inputs = {i.value.name: i for i in b.inputs if i.fmap != -1}
    dtype = {i.value.name: i.value.type.dtype for i in b.inputs}
    dtype.update((n.out.name, n.out.type.dtype) for n in b.nodes)
    real = {i.value.name: i.value.type.shape for i in b.inputs}
    real.update((n.out.name, n.out.type.shape) for n in b.nodes)
    fma = {n.out.name for n in b.nodes if op_info(n.op).category is Category.MATMUL
           and fma_matmul(real[n.args[0]], real[n.args[1]])}
    dots = [n for n in b.nodes if op_info(n.op).category is Category.MATMUL and n.out.name not in fma]

    def ancestors(v: str) -> set[str]:
        seen, todo = set(), [v]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in producer:
                todo.extend(producer[x].args)
        return seen

    pipelined: set[str] = set()
    if b.forloop > 1 and num_stages > 1:
        if dots:
            for n in dots:
                for a in n.args:
                    pipelined |= ancestors(a) & loop_inputs.keys()
        else:
            pipelined = set(loop_inputs)
    staged = (num_stages - 1) * sum(math.prod(pad[v]) * DTYPE_BYTES[dtype[v]] for v in pipelined)

    op_bytes = DTYPE_BYTES[dot_dtype(b)]
    accums = {n.out.name for n in b.nodes if op_info(n.op).category is Category.ACCUM}
    invariant = {v for v in pad if not (ancestors(v) & (loop_inputs.keys() | accums))}
    persistent, transient = 0, 0
    for n in b.nodes:
        cat = op_info(n.op).category
        if n.out.name in fma:  # broadcast product + tl.sum over K: a cross-warp reduction, and an
            # operand converted (in float32) to the product's layout where its load's layout differs
            pm, pk = pad[n.args[0]]
            operand = max(math.prod(pad[a]) for a in n.args) * 4
            transient = max(transient, pm * pad[n.out.name][1] * min(num_warps, pk) * 4, operand)
        elif cat is Category.MATMUL:
            need = 0
            in_loop = b.forloop > 1 and n.out.name not in invariant
            for j, a in enumerate(n.args):
                src = _unwidened(a, producer, dtype)
                k = len(pad[src]) - (1 if j == 0 else 2)
                # an MMA dot reads a pipelined load in place; a masked or converted operand, or any
                # operand of an fp32 (FMA) dot, is written to a new buffer
                direct = pad[src][k] == real[src][k] and DTYPE_BYTES[dtype[src]] == op_bytes < 4
                if src in pipelined and direct:
                    continue
                if in_loop and a in invariant:  # converted once before the loop, live all of it
                    persistent += math.prod(pad[a]) * op_bytes
                else:
                    need += math.prod(pad[a]) * op_bytes
            transient = max(transient, need)
        elif cat is Category.REDUCE:
            src, dim = n.args[0], n.attr("dim")
            transient = max(transient, math.prod(pad[n.out.name]) * min(num_warps, pad[src][dim]) * 4)
        elif n.op == "concat":  # rendered as tl.join + permute + reshape (RoPE's rotate_half): the joined
            # tile may change layout through shared memory (512 B for a [2, 64] fp32 tile on sm_90)
            transient = max(transient, math.prod(pad[n.out.name]) * 4)
        elif n.op == "transpose":
            po = pad[n.out.name]
            full = math.prod(po) * 4
            # a transpose with an extent-1 side only relabels: converted in chunks of ~1 KB a warp
            transient = max(transient, full if min(po[-2:]) > 1 else min(full, 2048 * num_warps))
    return staged + persistent + transient + _stacked_split_bytes(dots, pad)


def _stacked_split_bytes(dots: list, pad: dict[str, tuple[int, ...]]) -> int:
    """The float32 [2N, M] sum of each pair of dots that may be stacked (module docstring)."""
    by_operand: dict[tuple, int] = {}
    for n in dots:
        po = pad[n.out.name]
        if len(po) == 2 and po[0] < WGMMA_MIN_ROWS and po[1] < WGMMA_MIN_ROWS <= 2 * po[1]:
            key = (n.args[0], po)
            by_operand[key] = by_operand.get(key, 0) + 1
    return sum(count // 2 * 2 * math.prod(po) * 4 for (_, po), count in by_operand.items())


def _unwidened(v: str, producer: dict, dtype: dict) -> str:
    """The fp16/bf16 value a float32 ``v`` was cast from (the renderer feeds the dot with it)."""
    n = producer.get(v)
    while n is not None and n.op == "cast" and dtype[n.args[0]] in ("float16", "bfloat16"):
        v = n.args[0]
        n = producer.get(v)
    return v


def default_stages(b: BlockGraph, num_warps: int | None = None, arch: str = "sm_90") -> int | None:
    """The most pipelined of ``STAGE_CHOICES`` whose estimate fits ``arch``; None if none fits."""
    budget = SMEM_BUDGET[arch]
    return next((s for s in STAGE_CHOICES if triton_smem_bytes(b, num_warps, s) <= budget), None)


def launch_fits(g, num_warps: int, num_stages: int, arch: str = "sm_90", chained: bool = False) -> bool:
    """Whether every customized op of kernel graph ``g`` fits ``arch`` at this launch config;
    ``chained``: a kernel running its consumer too (``ir.chain``) is counted as both (Triton may
    reuse one's buffers for the other; the sum is the bound)."""
    from .chain import chains

    need = {i: triton_smem_bytes(n.block, num_warps, num_stages) for i, n in enumerate(g.nodes) if n.op == "customized"}
    for c in chains(g).values() if chained else ():
        need[c.producer] += need.pop(c.consumer)
    return all(v <= SMEM_BUDGET[arch] for v in need.values())
