"""Triton forms of the block-level data-movement ops: permute, and slice / concat of halves.

Triton has no slicing of a register tile, but it joins two tiles along a new last axis
(``tl.join``) and splits a last axis of 2 (``tl.split``). A concat of two equal halves along
dim d is therefore join → move the new axis in front of d → reshape; a slice of one half is the
reverse. RoPE's rotate_half (cat(−x₂, x₁) over the head dim) is exactly this. Only halves whose
size is a power of two (no padding: real extent = register extent) have this form; anything
else raises ``NotImplementedError`` naming the op, and the graph runs on another backend.
"""
from __future__ import annotations

from ..ir import Node


def moved_tile(n: Node, args: list[str], real: dict, pad: dict) -> str:
    """The expression of block node ``n`` (permute, slice, concat) over its operands ``args``."""
    out = n.out.name
    if n.op == "permute":
        return f"tl.permute({args[0]}, {tuple(n.attr('perm'))})"
    dim = n.attr("dim")
    if n.op == "concat":
        a, b = n.args if len(n.args) == 2 else (None, None)
        if a is None or not _exact_half(real[a], pad[a], dim) or real[a] != real[b] or pad[a] != pad[b]:
            raise NotImplementedError(f"render_triton: concat -> %{out} is not of two equal power-of-two "
                                      f"halves (real {[real[x] for x in n.args]})")
        rank = len(real[a])
        # join: [..., h_d, ...post, 2]; move the pair axis in front of d; merge it with d
        perm = list(range(dim)) + [rank] + list(range(dim, rank))
        shape = list(pad[a])
        shape[dim] *= 2
        x = f"tl.reshape(tl.permute(tl.join({args[0]}, {args[1]}), {tuple(perm)}), {tuple(shape)})"
        # an output tile padded wider than the two halves (a head dim of 8 beside tiles padded to 16 for
        # tl.dot): the concat is the front of the register tile, zeros after it, joined in the same way
        while shape[dim] < pad[out][dim]:
            shape[dim] *= 2
            x = f"tl.reshape(tl.permute(tl.join({x}, tl.zeros_like({x})), {tuple(perm)}), {tuple(shape)})"
        if shape[dim] != pad[out][dim]:
            raise NotImplementedError(f"render_triton: concat -> %{out} of halves of {pad[a][dim]} into a tile "
                                      f"of {pad[out][dim]}")
        return x
    src = n.args[0]
    size = real[src][dim]
    start, stop = n.attr("start"), n.attr("stop")
    if size % 2 or (start, stop) not in ((0, size // 2), (size // 2, size)) or \
            not _exact_half(tuple(s // 2 if d == dim else s for d, s in enumerate(real[src])),
                            tuple(p // 2 if d == dim else p for d, p in enumerate(pad[src])), dim) or \
            real[src][dim] != pad[src][dim]:
        raise NotImplementedError(f"render_triton: slice -> %{out} [{start}:{stop}] of a dim of {size} is "
                                  f"not a power-of-two half")
    rank = len(real[src])
    shape = list(pad[src])
    split = shape[:dim] + [2, shape[dim] // 2] + shape[dim + 1:]
    perm = list(range(dim)) + list(range(dim + 1, rank + 1)) + [dim]  # the pair axis last
    halves = f"tl.split(tl.permute(tl.reshape({args[0]}, {tuple(split)}), {tuple(perm)}))"
    return f"{halves}[{0 if start == 0 else 1}]"


def _exact_half(real: tuple, pad: tuple, dim: int) -> bool:
    h = real[dim]
    return h == pad[dim] and h & (h - 1) == 0


__all__ = ["moved_tile"]
