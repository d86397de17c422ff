"""Triton forms of the block-level data-movement ops: permute, and slice / concat along one dim.

Triton has no slicing of a register tile, but it joins two tiles along a new last axis
(``tl.join``) and splits a last axis of 2 (``tl.split``). A concat of two equal halves along
dim d is therefore join → move the new axis in front of d → reshape; a slice of one half is the
reverse. RoPE's rotate_half (cat(−x₂, x₁) over the head dim) is exactly this when the halves'
size is a power of two (no padding: real extent = register extent).

Where a register tile is padded past its real extent (a head dim of 96 or 80: halves of 48 or 40
in tiles of 64), the padded halves are joined the same way and the result is gathered from that
tile (``tl.gather``, an index per output element): element j of cat(a, b) is a[j] below a's extent,
then b[j − extent], and zero in the padding; a slice [start:stop] reads element j + start. Any
other movement raises ``NotImplementedError`` naming the op, and the graph runs on another backend.
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
        if a is None or pad[a] != pad[b] or _off_dim(real[a], dim) != _off_dim(real[b], dim):
            raise NotImplementedError(f"render_triton: concat -> %{out} is not of two tiles of one register "
                                      f"shape (real {[real[x] for x in n.args]}, padded {[pad[x] for x in n.args]})")
        x = _joined(args[0], args[1], pad[a], dim)
        if not (_exact_half(real[a], pad[a], dim) and real[a] == real[b]):
            ha, hb, p = real[a][dim], real[b][dim], pad[a][dim]
            j = _lane(pad[out], dim)
            index = f"tl.where({j} < {ha}, {j}, tl.where({j} < {ha + hb}, {j} + {p - ha}, 0))"
            return _gathered(x, index, f"{j} < {ha + hb}", pad[out], dim)
        # an output tile padded wider than the two halves (a head dim of 8 beside tiles padded to 16 for
        # tl.dot): the concat is the front of the register tile, zeros after it, joined in the same way
        shape = list(pad[a])
        shape[dim] *= 2
        while shape[dim] < pad[out][dim]:
            x = _joined(x, f"tl.zeros_like({x})", tuple(shape), dim)
            shape[dim] *= 2
        if shape[dim] != pad[out][dim]:
            raise NotImplementedError(f"render_triton: concat -> %{out} of halves of {pad[a][dim]} into a tile "
                                      f"of {pad[out][dim]}")
        return x
    src = n.args[0]
    size = real[src][dim]
    start, stop = n.attr("start"), n.attr("stop")
    if not _half_slice(real[src], pad[src], dim, start, stop):
        if n.attr("step", 1) not in (None, 1) or not 0 <= start < stop <= size:
            raise NotImplementedError(f"render_triton: slice -> %{out} [{start}:{stop}] of a dim of {size}")
        j = _lane(pad[out], dim)
        return _gathered(args[0], f"tl.where({j} < {stop - start}, {j} + {start}, 0)", f"{j} < {stop - start}",
                         pad[out], dim)
    rank = len(real[src])
    shape = list(pad[src])
    split = shape[:dim] + [2, shape[dim] // 2] + shape[dim + 1:]
    perm = list(range(dim)) + list(range(dim + 1, rank + 1)) + [dim]  # the pair axis last
    halves = f"tl.split(tl.permute(tl.reshape({args[0]}, {tuple(split)}), {tuple(perm)}))"
    return f"{halves}[{0 if start == 0 else 1}]"


def _half_slice(real: tuple, pad: tuple, dim: int, start: int, stop: int) -> bool:
    """A slice of one power-of-two half of an unpadded dim: ``tl.split``'s form."""
    size = real[dim]
    return not size % 2 and (start, stop) in ((0, size // 2), (size // 2, size)) and real[dim] == pad[dim] and \
        _exact_half(tuple(s // 2 if d == dim else s for d, s in enumerate(real)),
                    tuple(p // 2 if d == dim else p for d, p in enumerate(pad)), dim)


def _joined(a: str, b: str, pad: tuple, dim: int) -> str:
    """Register tiles ``a`` and ``b`` (padded shape ``pad``) one after the other along ``dim``: join them on a new
    last axis, move that pair axis in front of ``dim``, merge the two."""
    rank = len(pad)
    perm = list(range(dim)) + [rank] + list(range(dim, rank))
    shape = list(pad)
    shape[dim] *= 2
    return f"tl.reshape(tl.permute(tl.join({a}, {b}), {tuple(perm)}), {tuple(shape)})"


def _lane(pad: tuple, dim: int) -> str:
    """The output element's index along ``dim``, shaped to broadcast against a tile padded to ``pad``."""
    shape = tuple(p if d == dim else 1 for d, p in enumerate(pad))
    return f"tl.reshape(tl.arange(0, {pad[dim]}), {shape})"


def _gathered(x: str, index: str, keep: str, pad: tuple, dim: int) -> str:
    """Tile ``x``'s elements along ``dim`` at ``index`` (one per output element of a tile padded to ``pad``), zero
    where ``keep`` is false (the padding past the real extent)."""
    return f"tl.where({keep}, tl.gather({x}, tl.broadcast_to({index}, {tuple(pad)}), {dim}), 0.0)"


def _off_dim(shape: tuple, dim: int) -> tuple:
    return tuple(s for d, s in enumerate(shape) if d != dim)


def _exact_half(real: tuple, pad: tuple, dim: int) -> bool:
    h = real[dim]
    return h == pad[dim] and h & (h - 1) == 0


__all__ = ["moved_tile"]
