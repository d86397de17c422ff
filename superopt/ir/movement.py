"""Data-movement ops of the IR: their shape rules and the views a block input reads through.

Kernel-level ops (rows of ``ops.OPS``, the block marked "data movement"):

* ``permute [perm=(…)]``: any permutation of the dims (``transpose`` is the last-two special case);
* ``repeat [dim=d, times=n]``: each slice along ``d`` repeated ``n`` times in place,
  ``torch.repeat_interleave`` — the GQA head expand HF writes as ``expand`` + ``reshape``
  (``repeat_kv``); on a size-1 dim it is ``expand``;
* ``gather(x, idx) [dim=d]``: ``x.index_select(d, idx)``, ``idx`` a 1-D ``int64`` tensor — rows
  of the RoPE cos / sin tables at the current positions;
* ``scatter(x, idx, src) [dim=d]``: ``x.index_copy(d, idx, src)`` as a *value*: the updated
  cache, functional (HF's StaticCache writes ``index_copy_`` in place; a μGraph names the result).
  Indices must be distinct (the KV-cache positions of one step are).

A *block input view* is how a slice, a chunk or a head repeat of a kernel's operand costs no
kernel: the block input reads the operand through a chain of index maps, applied before the
imap / fmap tiling (``tiling.input_tile_shape``). Each step is
``("slice", dim, start, stop)`` (an offset: view index i reads i + start) or
``("repeat", dim, times)`` (view index i reads i // times). Code generation adds the offset to
the pointer, or divides the index, so the operand is never copied.
"""
from __future__ import annotations

from typing import Sequence

from .graph import Attrs, TensorType

INDEX_DTYPES = ("int64",)

ViewStep = tuple  # ("slice", dim, start, stop) | ("repeat", dim, times)


class MovementError(ValueError):
    pass


def _attr(attrs: Attrs, key: str, op: str):
    for k, v in attrs:
        if k == key:
            return v
    raise MovementError(f"{op}: missing attribute {key!r}")


def _dim(op: str, dim: int, rank: int) -> int:
    if not 0 <= dim < rank:
        raise MovementError(f"{op}: dim {dim} out of range for a rank-{rank} operand (attributes hold "
                            f"non-negative dims)")
    return dim


def movement_type(op: str, args: Sequence[TensorType], attrs: Attrs) -> TensorType:
    """The result type of a data-movement op (``shapes.infer_type`` defers to this)."""
    if op == "permute":
        (a,) = args
        perm = tuple(_attr(attrs, "perm", op))
        if sorted(perm) != list(range(a.rank)):
            raise MovementError(f"permute: {list(perm)} is not a permutation of the {a.rank} dims of "
                                f"{list(a.shape)}")
        return TensorType(tuple(a.shape[p] for p in perm), a.dtype)
    if op == "repeat":
        (a,) = args
        d = _dim(op, _attr(attrs, "dim", op), a.rank)
        times = _attr(attrs, "times", op)
        if not isinstance(times, int) or times < 1:
            raise MovementError(f"repeat: times must be a positive integer, got {times!r}")
        shape = list(a.shape)
        shape[d] *= times
        return TensorType(tuple(shape), a.dtype)
    if op == "gather":
        x, idx = args
        d = _dim(op, _attr(attrs, "dim", op), x.rank)
        _index_operand(op, idx)
        shape = list(x.shape)
        shape[d] = idx.shape[0]
        return TensorType(tuple(shape), x.dtype)
    if op == "scatter":
        x, idx, src = args
        d = _dim(op, _attr(attrs, "dim", op), x.rank)
        _index_operand(op, idx)
        want = list(x.shape)
        want[d] = idx.shape[0]
        if list(src.shape) != want or src.dtype != x.dtype:
            raise MovementError(f"scatter: source {src.dtype}{list(src.shape)} does not fit "
                                f"{x.dtype}{list(x.shape)} at {idx.shape[0]} index(es) of dim {d}; "
                                f"expected {x.dtype}{want}")
        if idx.shape[0] > x.shape[d]:
            raise MovementError(f"scatter: {idx.shape[0]} distinct indices into a dim of {x.shape[d]}")
        return x
    raise MovementError(f"{op}: not a data-movement op")


def _index_operand(op: str, idx: TensorType) -> None:
    if idx.dtype not in INDEX_DTYPES or idx.rank != 1:
        raise MovementError(f"{op}: the index operand must be a 1-D {'/'.join(INDEX_DTYPES)} tensor, "
                            f"got {idx.dtype}{list(idx.shape)}")


# ---------------------------------------------------------------- block input views


def view_shape(shape: tuple[int, ...], view: tuple[ViewStep, ...], what: str = "input") -> tuple[int, ...]:
    """The shape a block input sees of an operand of ``shape`` through ``view``."""
    out = list(shape)
    for step in view:
        kind = step[0] if step else None
        if kind == "slice" and len(step) == 4:
            _, d, start, stop = step
            if not 0 <= d < len(out) or not 0 <= start < stop <= out[d]:
                raise MovementError(f"{what}: view step {step} out of range for {out}")
            out[d] = stop - start
        elif kind == "repeat" and len(step) == 3:
            _, d, times = step
            if not 0 <= d < len(out) or not isinstance(times, int) or times < 1:
                raise MovementError(f"{what}: view step {step} invalid for {out}")
            out[d] *= times
        else:
            raise MovementError(f"{what}: unknown view step {step!r}; expected ('slice', dim, start, stop) "
                                f"or ('repeat', dim, times)")
    return tuple(out)


def source_index(view: tuple[ViewStep, ...], dim: int, index: int) -> int:
    """Where view index ``index`` of dim ``dim`` reads its operand (the steps applied backwards)."""
    for step in reversed(view):
        if step[1] != dim:
            continue
        if step[0] == "slice":
            index += step[2]
        else:
            index //= step[2]
    return index


def apply_view(x, view: tuple[ViewStep, ...], domain):
    """The operand ``x`` seen through ``view`` in ``domain`` (slices and repeats of whole values)."""
    for step in view:
        if step[0] == "slice":
            x = domain.slice(x, step[1], step[2], step[3])
        else:
            x = repeat_value(x, step[1], step[2], domain)
    return x


def repeat_value(x, dim: int, times: int, domain):
    """``repeat_interleave(x, times, dim)`` from reshape and broadcast (every Domain has them)."""
    if times == 1:
        return x
    shape = tuple(domain.shape(x))
    y = domain.reshape(x, shape[:dim + 1] + (1,) + shape[dim + 1:])
    y = domain.broadcast_to(y, shape[:dim + 1] + (times,) + shape[dim + 1:])
    return domain.reshape(y, shape[:dim] + (shape[dim] * times,) + shape[dim + 1:])


__all__ = ["INDEX_DTYPES", "MovementError", "ViewStep", "apply_view", "movement_type", "repeat_value",
           "source_index", "view_shape"]
