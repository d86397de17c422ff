"""Re-tile a customized op: same block graph structure, other grid extents and for-loop range.

The profiler's "split factors": a μGraph found at one tiling is re-instantiated at others
(tile types re-inferred, the whole graph re-checked) and the fastest is kept. Re-tiling keeps the
graph's meaning when every loop-variant value is accumulated by sums/maxima and tiles are only
cut along dims that ops treat element by element — true of the matmul-over-K blocks it is
offered for (``dense_tilings``); callers check each result numerically before use.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import (BlockGraph, GraphError, KernelGraph, TensorType, TilingError, Value, check, infer_type,
                  output_shape)
from ..ir.shapes import ShapeError
from ..ir.tiling import block_input_tile


def retile(g: KernelGraph, node_index: int, grid: tuple[int, int, int], forloop: int) -> KernelGraph:
    """``g`` with customized node ``node_index`` run on ``grid`` × ``forloop``; raises if invalid.

    Every type downstream is re-inferred: a block that writes per-split partial results (flash
    decoding) changes the shape of its outputs, and the kernels reading them follow.
    """
    kinds = {v.name: v.type for v in g.inputs}
    nodes = []
    for idx, n in enumerate(g.nodes):
        args = [kinds[a] for a in n.args]
        if n.op == "customized":
            b = n.block
            if idx == node_index:
                b = replace(b, grid=tuple(grid), forloop=forloop)
            b = _reinfer_block(b, args)
            outs = tuple(Value(v.name, TensorType(output_shape(_block_type(b, o.value).shape, b.grid, o.omap),
                                                  v.type.dtype)) for v, o in zip(n.outs, b.outputs))
            n = replace(n, block=b, outs=outs)
        else:
            n = replace(n, outs=(Value(n.out.name, infer_type(n.op, args, n.attrs)),))
        kinds.update((v.name, v.type) for v in n.outs)
        nodes.append(n)
    new = replace(g, nodes=tuple(nodes), _types=None)
    if new.output_types != g.output_types:
        raise GraphError(f"retile: outputs change from {g.output_types} to {new.output_types}")
    return check(new)


def _block_type(b: BlockGraph, name: str) -> TensorType:
    for i in b.inputs:
        if i.value.name == name:
            return i.value.type
    return next(n.out.type for n in b.nodes if n.out.name == name)


def _reinfer_block(b: BlockGraph, args: list[TensorType]) -> BlockGraph:
    types: dict[str, TensorType] = {}
    inputs = []
    for i in b.inputs:
        t = TensorType(block_input_tile(b, i, args[i.source].shape), i.value.type.dtype)
        types[i.value.name] = t
        inputs.append(replace(i, value=Value(i.value.name, t)))
    nodes = []
    for bn in b.nodes:
        t = bn.out.type if bn.op == "const" else infer_type(bn.op, [types[a] for a in bn.args], bn.attrs)
        types[bn.out.name] = t
        nodes.append(replace(bn, outs=(Value(bn.out.name, t),)))
    return replace(b, inputs=tuple(inputs), nodes=tuple(nodes))


def split_kv_tilings(g: KernelGraph, sms: int = 132, kv_tiles=(32, 64, 128)) -> list[KernelGraph]:
    """Flash-decoding re-tilings: the first kernel's KV splits (the grid axis that cuts the dim its
    for-loop walks) and KV tile per iteration.

    The two smallest split counts that put at least one block on every one of ``sms`` SMs and at
    most four (a split kernel's block holds a few tens of KB of registers and shared memory, so
    four fit an SM at once: still one wave), KV tiles that divide each split; the combine kernel
    follows the new number of splits. Up to two blocks an SM only, decode attention at 4k tokens
    b1 (16.8 MB, 256 blocks of 128 tokens) ran its split kernel at 36% of the copy bandwidth where
    a kernel only reading the same bytes in 512 blocks reached 65%
    (``benchmarks/probe_attention_floor.py``).
    """
    idx = next((i for i, n in enumerate(g.nodes) if n.op == "customized"), None)
    if idx is None:
        return []
    n = g.nodes[idx]
    b = n.block
    walked = {(a, g.type_of(n.args[i.source]).shape[i.fmap]) for i in b.inputs if i.fmap != -1
              for a in range(3) if i.imap[a] == i.fmap}
    if len(walked) != 1:
        return []
    ((axis, length),) = walked
    others = b.num_blocks // b.grid[axis]
    out = []
    for splits in sorted(s for s in range(1, length + 1) if length % s == 0 and sms <= others * s <= 4 * sms)[:2]:
        for t in kv_tiles:
            if (length // splits) % t:
                continue
            grid = list(b.grid)
            grid[axis] = splits
            try:
                out.append(retile(g, idx, tuple(grid), length // splits // t))
            except (GraphError, TilingError, ShapeError):  # e.g. the combine's tile outgrows the SM
                continue
    return out


def dense_tilings(g: KernelGraph, n_tiles=(16, 32, 48, 64, 128), k_tiles=(128, 256, 512), sms: int = 132,
                  keep: int = 2) -> list[KernelGraph]:
    """Re-tilings of a one-kernel graph whose block splits output columns on grid y and walks K.

    Tiles of N / grid_y columns and K / forloop rows (of each block's part of K), keeping grid x (1)
    and z (1, or the number of K parts of a split-K graph). Decode GEMVs are memory-bound, so what
    matters is keeping every SM streaming: the ``keep`` column tilings whose block count fills
    whole waves of ``sms`` best, each with every K tile. Tiles as narrow as 16 columns are offered
    because 6144 columns (Llama-3-8B qkv) fill 132 SMs evenly only as 128 or 384 blocks, and the
    128-block tiling lost to torch.compile at 8 rows (fourteenth session).
    """
    idx = [i for i, n in enumerate(g.nodes) if n.op == "customized"]
    if len(idx) != 1:
        return []
    n = g.nodes[idx[0]]
    b = n.block
    y_dims = {g.type_of(n.args[i.source]).shape[i.imap[1]] for i in b.inputs if i.imap[1] != -1}
    # the lengths blocks' loops walk: K, or K / grid z where z cuts K too (split-K; a split-K
    # RMSNorm walks its part of K for the product and the whole rows for the rms in one loop)
    k_dims = {g.type_of(n.args[i.source]).shape[i.fmap] // (b.grid[2] if i.imap[2] == i.fmap else 1)
              for i in b.inputs if i.fmap != -1}
    if len(y_dims) != 1 or not k_dims or b.grid[0] != 1:
        return []
    (N,), K = y_dims, min(k_dims)

    def fill(bn: int) -> float:  # fraction of SM-slots busy over the waves the grid needs
        blocks = N // bn * b.grid[2]
        return blocks / (-(-blocks // sms) * sms)
    widths = sorted((bn for bn in n_tiles if N % bn == 0), key=lambda bn: (-fill(bn), -bn))[:keep]
    out = []
    for bn in widths:
        for bk in k_tiles:
            if K % bk:
                continue
            try:
                out.append(retile(g, idx[0], (1, N // bn, b.grid[2]), K // bk))
            except (GraphError, TilingError, ShapeError):
                continue
    return out
