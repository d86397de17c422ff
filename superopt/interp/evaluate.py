"""Evaluate any valid μGraph exactly as tiled, in any Domain.

Kernel-level library ops apply to whole tensors. A customized op runs its block graph the way the
GPU would — per threadblock, per for-loop iteration, with accumulators — except that all blocks of
the grid are evaluated at once: every block value carries three leading grid axes (x, y, z), of
extent 1 where it does not vary with that axis, so one op call computes it for the whole grid.

Block evaluation order (``ir.block_variance``): loop-invariant nodes once before the loop; each
iteration the loop-variant nodes and the accumulators in graph order (``accum_max`` is updated
before the nodes that read its running value); after the loop the nodes that read final values.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..ir import BlockGraph, KernelGraph, Node, Variance, block_variance, op_info
from ..ir.ops import Category
from ..ir.movement import apply_view
from ..ir.tiling import input_tile_shape, reduced_axes
from .domain import Domain
from .movement import MOVEMENT_OPS, apply_movement

G = 3  # leading grid axes on every block value


def evaluate(graph: KernelGraph, inputs: Mapping[str, Any] | Sequence[Any], domain: Domain) -> list[Any]:
    """Run ``graph`` on ``inputs`` (by name, or in the order of ``graph.inputs``); return its outputs."""
    if not isinstance(inputs, Mapping):
        inputs = dict(zip((v.name for v in graph.inputs), inputs))
    env: dict[str, Any] = {}
    for v in graph.inputs:
        if v.name not in inputs:
            raise KeyError(f"evaluate: no value given for input %{v.name} of graph {graph.name!r}")
        x = inputs[v.name]
        if tuple(domain.shape(x)) != v.type.shape:
            raise ValueError(f"evaluate: input %{v.name} has shape {list(domain.shape(x))}, "
                             f"expected {list(v.type.shape)}")
        env[v.name] = x
    for n in graph.nodes:
        args = [env[a] for a in n.args]
        if n.op == "customized":
            results = _run_block(n.block, args, domain)
            env.update((v.name, r) for v, r in zip(n.outs, results))
        else:
            env[n.out.name] = apply_op(n, args, domain)
    return [env[o] for o in graph.outputs]


def apply_op(n: Node, args: list[Any], domain: Domain, offset: int = 0) -> Any:
    """One library op on whole values; ``offset`` leading axes (the grid) are carried through."""
    cat = op_info(n.op).category
    if cat is Category.CONST:
        return domain.const(n.attr("value"), n.attr("dtype"))
    if cat is Category.UNARY:
        return domain.unary(n.op, args[0])
    if cat is Category.BINARY:
        a, b = _align(args, domain, offset)
        return domain.binary(n.op, a, b)
    if cat is Category.REDUCE:
        return domain.reduce(n.op, args[0], offset + n.attr("dim"), bool(n.attr("keepdim")))
    if cat is Category.MATMUL:
        a, b = _align(args, domain, offset)
        return domain.matmul(a, b)
    if n.op == "cast":
        return domain.cast(args[0], n.attr("dtype"))
    if n.op == "transpose":
        rank = len(domain.shape(args[0]))
        axes = list(range(rank))
        axes[-1], axes[-2] = axes[-2], axes[-1]
        return domain.permute(args[0], axes)
    if n.op == "reshape":
        return domain.reshape(args[0], n.attr("shape"))
    if n.op == "slice":
        return domain.slice(args[0], offset + n.attr("dim"), n.attr("start"), n.attr("stop"))
    if n.op == "concat":
        xs = args
        if offset:
            grid = _common_grid([domain.shape(x) for x in xs])
            xs = [domain.broadcast_to(x, grid + tuple(domain.shape(x)[offset:])) for x in xs]
        return domain.concat(xs, offset + n.attr("dim"))
    if n.op in MOVEMENT_OPS:
        return apply_movement(n, args, domain, offset)
    raise NotImplementedError(f"evaluate: no rule for op {n.op!r}")


def _common_grid(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(max(s[a] for s in shapes) for a in range(G))


def _align(args: list[Any], domain: Domain, offset: int) -> list[Any]:
    """Right-align tile ranks under the grid axes, so numpy broadcasting matches tile broadcasting."""
    if not offset:
        return args
    shapes = [tuple(domain.shape(x)) for x in args]
    rank = max(len(s) for s in shapes)
    return [x if len(s) == rank else domain.reshape(x, s[:offset] + (1,) * (rank - len(s)) + s[offset:])
            for x, s in zip(args, shapes)]


# ---------------------------------------------------------------- block graphs


def _tile_view(x: Any, shape: tuple[int, ...], b: BlockGraph, imap, fmap: int, domain: Domain) -> Any:
    """View a device tensor as [Gx, Gy, Gz, F, *tile] per the imap/fmap rules of ``ir.tiling``."""
    rank = len(shape)
    split: list[int] = []
    for d in range(rank):
        g = next((b.grid[a] for a in range(G) if imap[a] == d), 1)
        f = b.forloop if fmap == d else 1
        split += [g, f, shape[d] // (g * f)]
    x = domain.reshape(x, split)  # dim d -> (grid part, loop part, tile part)
    order = [3 * imap[a] for a in range(G) if imap[a] != -1]
    order += [3 * fmap + 1] if fmap != -1 else []
    order += [3 * d + 2 for d in range(rank)]
    order += [i for i in range(3 * rank) if i not in order]  # leftover extent-1 axes
    x = domain.permute(x, order)
    gx, gy, gz = (b.grid[a] if imap[a] != -1 else 1 for a in range(G))
    tile = input_tile_shape(shape, b.grid, imap, fmap, b.forloop)
    return domain.reshape(x, [gx, gy, gz, b.forloop if fmap != -1 else 1, *tile])


def _loop_slice(view: Any, i: int, domain: Domain) -> Any:
    s = domain.shape(view)
    if s[G] == 1:
        i = 0
    return domain.reshape(domain.slice(view, G, i, i + 1), s[:G] + s[G + 1:])


def _accumulate(n: Node, env: dict, acc: dict, prev_max: dict, first: bool, domain: Domain) -> None:
    name = n.out.name
    x = env[n.args[0]]
    if n.op == "accum_sum_sq":
        x = domain.unary("square", x)
    if first:
        acc[name] = x
    elif n.op in ("accum_sum", "accum_sum_sq"):
        acc[name] = domain.binary("add", acc[name], x)
    elif n.op == "accum_max":
        acc[name] = domain.binary("max", acc[name], x)
    else:  # accum_sum_rescaled: acc * exp(m_prev - m_cur) + x
        m = n.args[1]
        scale = domain.unary("exp", domain.binary("sub", prev_max[m], acc[m]))
        a, s = _align([acc[name], scale], domain, G)
        acc[name] = domain.binary("add", domain.binary("mul", a, s), x)
    env[name] = acc[name]


def _run_block(b: BlockGraph, args: list[Any], domain: Domain) -> list[Any]:
    var = block_variance(b)
    env: dict[str, Any] = {}
    views: dict[str, Any] = {}
    for inp in b.inputs:
        x = args[inp.source]
        if inp.view:
            x = apply_view(x, inp.view, domain)
        view = _tile_view(x, tuple(domain.shape(x)), b, inp.imap, inp.fmap, domain)
        if inp.fmap == -1:
            env[inp.value.name] = _loop_slice(view, 0, domain)
        else:
            views[inp.value.name] = view
    for n in b.nodes:
        if var[n.out.name] == Variance.PRE:
            env[n.out.name] = apply_op(n, [env[a] for a in n.args], domain, G)
    acc: dict[str, Any] = {}
    in_loop = [n for n in b.nodes if var[n.out.name] in (Variance.LOOP, Variance.RUNNING)
               or op_info(n.op).category is Category.ACCUM]
    for i in range(b.forloop):
        for name, view in views.items():
            env[name] = _loop_slice(view, i, domain)
        prev_max = {k: v for k, v in acc.items()}
        for n in in_loop:
            if op_info(n.op).category is Category.ACCUM:
                _accumulate(n, env, acc, prev_max, i == 0, domain)
            else:
                env[n.out.name] = apply_op(n, [env[a] for a in n.args], domain, G)
    for n in b.nodes:
        if var[n.out.name] == Variance.POST and op_info(n.op).category is not Category.ACCUM:
            env[n.out.name] = apply_op(n, [env[a] for a in n.args], domain, G)
    return [_write_output(env[o.value], o, b, domain) for o in b.outputs]


def _write_output(v: Any, o, b: BlockGraph, domain: Domain) -> Any:
    """Assemble the per-block tiles [Gx, Gy, Gz, *tile] into the device tensor the omap describes."""
    s = tuple(domain.shape(v))
    v = domain.broadcast_to(v, tuple(b.grid) + s[G:])
    for a in reduced_axes(o, b.grid):
        v = domain.reduce("reduce_sum", v, a, True)
    tile = s[G:]
    order: list[int] = []
    out_shape: list[int] = []
    for d in range(len(tile)):
        axis = next((a for a in range(G) if o.omap[a] == d), None)
        if axis is not None:
            order.append(axis)
        order.append(G + d)
        out_shape.append(tile[d] * (b.grid[axis] if axis is not None else 1))
    order += [a for a in range(G) if a not in order]  # extent-1 (or reduced) axes
    return domain.reshape(domain.permute(v, order), out_shape)
