"""Shape and dtype inference for every op, shared by the Lax builder, the checker and the search.

Errors name the op, the operand, the shapes and what was expected, because they are what a
person sees when a program is built wrong or a patcher extracts something unexpected.
"""
from __future__ import annotations

from typing import Sequence

from .graph import Attrs, TensorType
from .movement import MovementError, movement_type
from .ops import DTYPES, Category, op_info

MOVEMENT_OPS = frozenset({"permute", "repeat", "gather", "scatter"})


class ShapeError(ValueError):
    pass


def _attr(attrs: Attrs, key: str, op: str):
    for k, v in attrs:
        if k == key:
            return v
    raise ShapeError(f"{op}: missing attribute {key!r}")


def broadcast_shapes(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            raise ShapeError(
                f"{op}: operands of shapes {list(a)} and {list(b)} do not broadcast "
                f"(dim -{i}: {x} vs {y}); expected equal sizes or 1"
            )
        out.append(max(x, y))
    return tuple(reversed(out))


def normalize_dim(op: str, dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise ShapeError(f"{op}: dim {dim} out of range for a rank-{rank} operand")
    return dim % rank


def infer_type(op: str, args: Sequence[TensorType], attrs: Attrs = ()) -> TensorType:
    """The result type of a single-output op. ``customized`` ops carry their own output types."""
    info = op_info(op)
    if info.arity >= 0 and len(args) != info.arity:
        raise ShapeError(f"{op}: expected {info.arity} operand(s), got {len(args)}")
    cat = info.category
    if cat is Category.CONST:
        dtype = _attr(attrs, "dtype", op)
        if dtype not in DTYPES:
            raise ShapeError(f"const: dtype {dtype!r} is not one of {DTYPES}")
        return TensorType((), dtype)
    if cat is Category.UNARY:
        return args[0]
    if cat is Category.BINARY:
        a, b = args
        if a.dtype != b.dtype:
            raise ShapeError(
                f"{op}: operand dtypes differ ({a.dtype} vs {b.dtype}); insert a cast"
            )
        return TensorType(broadcast_shapes(op, a.shape, b.shape), a.dtype)
    if cat is Category.REDUCE:
        (a,) = args
        dim = normalize_dim(op, _attr(attrs, "dim", op), a.rank)
        keep = bool(_attr(attrs, "keepdim", op))
        shape = list(a.shape)
        if keep:
            shape[dim] = 1
        else:
            del shape[dim]
        return TensorType(tuple(shape), a.dtype)
    if cat is Category.MATMUL:
        a, b = args
        if a.rank < 2 or b.rank < 2:
            raise ShapeError(f"matmul: operands need rank >= 2, got {list(a.shape)} and {list(b.shape)}")
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(
                f"matmul: inner dims differ: lhs {list(a.shape)} has {a.shape[-1]}, "
                f"rhs {list(b.shape)} has {b.shape[-2]}; expected lhs[-1] == rhs[-2]"
            )
        if a.dtype != b.dtype:
            raise ShapeError(f"matmul: operand dtypes differ ({a.dtype} vs {b.dtype}); insert a cast")
        batch = broadcast_shapes(op, a.shape[:-2], b.shape[:-2])
        return TensorType(batch + (a.shape[-2], b.shape[-1]), a.dtype)
    if cat is Category.ACCUM:
        if op == "accum_sum_rescaled":
            x, m = args
            broadcast_shapes(op, x.shape, m.shape)
        return TensorType(args[0].shape, args[0].dtype)
    if cat is Category.STRUCTURAL:
        return _structural(op, args, attrs)
    raise ShapeError(f"{op}: results are declared by the node, not inferred")


def _structural(op: str, args: Sequence[TensorType], attrs: Attrs) -> TensorType:
    if op == "transpose":
        (a,) = args
        if a.rank < 2:
            raise ShapeError(f"transpose: operand of shape {list(a.shape)} needs rank >= 2")
        return TensorType(a.shape[:-2] + (a.shape[-1], a.shape[-2]), a.dtype)
    if op == "reshape":
        (a,) = args
        shape = tuple(_attr(attrs, "shape", op))
        n = 1
        for s in shape:
            n *= s
        if n != a.numel:
            raise ShapeError(f"reshape: cannot view {list(a.shape)} ({a.numel} elements) as {list(shape)}")
        return TensorType(shape, a.dtype)
    if op == "cast":
        (a,) = args
        dtype = _attr(attrs, "dtype", op)
        if dtype not in DTYPES:
            raise ShapeError(f"cast: dtype {dtype!r} is not one of {DTYPES}")
        return TensorType(a.shape, dtype)
    if op == "slice":
        (a,) = args
        dim = normalize_dim(op, _attr(attrs, "dim", op), a.rank)
        start, stop = _attr(attrs, "start", op), _attr(attrs, "stop", op)
        if not 0 <= start < stop <= a.shape[dim]:
            raise ShapeError(f"slice: [{start}:{stop}] out of range for dim {dim} of {list(a.shape)}")
        shape = list(a.shape)
        shape[dim] = stop - start
        return TensorType(tuple(shape), a.dtype)
    if op == "concat":
        if not args:
            raise ShapeError("concat: needs at least one operand")
        first = args[0]
        dim = normalize_dim(op, _attr(attrs, "dim", op), first.rank)
        total = 0
        for i, a in enumerate(args):
            if a.rank != first.rank or a.dtype != first.dtype or any(
                a.shape[d] != first.shape[d] for d in range(a.rank) if d != dim
            ):
                raise ShapeError(
                    f"concat: operand {i} {list(a.shape)} {a.dtype} does not match operand 0 "
                    f"{list(first.shape)} {first.dtype} outside dim {dim}"
                )
            total += a.shape[dim]
        shape = list(first.shape)
        shape[dim] = total
        return TensorType(tuple(shape), first.dtype)
    if op in MOVEMENT_OPS:
        try:
            return movement_type(op, args, attrs)
        except MovementError as e:
            raise ShapeError(str(e)) from None
    raise ShapeError(f"{op}: no shape rule")
