"""Extraction rules for the aten data-movement ops: permutes, head repeats, gathers and cache writes.

Registered into ``extract``'s rule table (they replace its last-two-dims-only transpose rules).
Each rule gets the program, the FX node and the mapped operands, like the rules there:

* ``permute`` / ``transpose.int`` of any dims;
* ``expand`` of size-1 dims: a ``repeat`` (HF's ``repeat_kv`` is unsqueeze → expand → reshape,
  which is ``repeat_interleave`` over the kv heads once the reshape merges the two dims);
* ``repeat_interleave`` by an integer;
* ``index_select`` and ``index.Tensor`` with one index tensor: a ``gather`` of rows
  (``cos[position_ids]``);
* ``index_copy`` (StaticCache's ``index_copy_``, functionalised by ``torch.export``) and
  ``index_put`` with one index tensor on one dim: a ``scatter``, the updated cache as a value.
"""
from __future__ import annotations

from typing import Callable

from . import Program, T


def _error(msg: str) -> Exception:
    from .extract import ExtractError  # the extract module imports this one at its end
    return ExtractError(msg)


def _permute(p: Program, node, a: T, perm):
    r = a.type.rank
    perm = [d % r for d in perm]
    if perm == list(range(r)):
        return a
    if perm == list(range(r - 2)) + [r - 1, r - 2]:
        return p.transpose(a)
    return p.permute(a, perm)


def _transpose(p: Program, node, a: T, d0=-2, d1=-1):
    r = a.type.rank
    if r < 2 or d0 % r == d1 % r:
        return a
    return p.swap_dims(a, d0, d1)


def _expand(p: Program, node, a: T, sizes, implicit=False):
    sizes = [int(s) for s in sizes]
    if len(sizes) > a.type.rank:  # leading new dims, as torch does
        a = p.reshape(a, (1,) * (len(sizes) - a.type.rank) + a.shape)
    for d, s in enumerate(sizes):
        if s == -1 or s == a.shape[d]:
            continue
        if a.shape[d] != 1:
            raise _error(f"{node.target}: cannot expand dim {d} of {list(a.shape)} to {s}")
        a = p.repeat_interleave(a, s, d)
    return a


def _repeat_interleave(p: Program, node, a: T, repeats, dim=None, output_size=None):
    if not isinstance(repeats, int) or dim is None:
        raise _error(f"{node.target}: only an integer repeat along a given dim is supported")
    return p.repeat_interleave(a, repeats, dim)


def _index_select(p: Program, node, a: T, dim: int, index: T):
    return p.gather(a, _index(node, index), dim % a.type.rank)


def _index(node, index) -> T:
    if not isinstance(index, T) or index.dtype != "int64" or index.type.rank != 1:
        raise _error(f"{node.target}: the index must be a 1-D int64 tensor, got {index!r}")
    return index


def _index_tensor(p: Program, node, a: T, indices):
    """``a[..., idx, ...]`` with exactly one index tensor (the others ``None``): a gather."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        raise _error(f"{node.target}: only one index tensor is supported, got {len(given)}")
    d, idx = given[0]
    if isinstance(idx, T) and idx.type.rank == 2 and idx.shape[0] == 1:  # position_ids [1, S]
        idx = p.reshape(idx, (idx.shape[1],))
        out = p.gather(a, _index(node, idx), d)
        return p.reshape(out, out.shape[:d] + (1,) + out.shape[d:])
    return p.gather(a, _index(node, idx), d)


def _index_copy(p: Program, node, a: T, dim: int, index: T, src: T):
    src = src if src.dtype == a.dtype else p.cast(src, a.dtype)
    return p.scatter(a, _index(node, index), src, dim % a.type.rank)


def _index_put(p: Program, node, a: T, indices, values: T, accumulate=False):
    if accumulate:
        raise _error(f"{node.target} with accumulate=True is not supported")
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        raise _error(f"{node.target}: only one index tensor is supported, got {len(given)}")
    d, idx = given[0]
    values = values if values.dtype == a.dtype else p.cast(values, a.dtype)
    return p.scatter(a, _index(node, idx), values, d)


MOVEMENT_RULES: dict[str, Callable] = {
    "aten.permute.default": _permute,
    "aten.transpose.int": _transpose,
    "aten.expand.default": _expand,
    "aten.repeat_interleave.self_int": _repeat_interleave,
    "aten.index_select.default": _index_select,
    "aten.index.Tensor": _index_tensor,
    "aten.index_copy.default": _index_copy,
    "aten.index_copy_.default": _index_copy,
    "aten.index_put.default": _index_put,
    "aten.index_put_.default": _index_put,
}

__all__ = ["MOVEMENT_RULES"]
