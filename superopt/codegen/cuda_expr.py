"""C expressions that read block values at tile coordinates: the index arithmetic of the kernel.

Coordinates are C expressions (strings), one per tile dim. ``Reader.read(name, coords)`` gives a
float32 expression for that element wherever the value lives (global tile, shared tile, inline
register expression, constant); elementwise and structural nodes compose into one expression.
"""
from __future__ import annotations

import math

from ..ir import Node
from ..ir.ops import BINARY_OPS, UNARY_OPS
from .cuda_plan import BlockPlan, InputPlan
from .common import identifier, strides


def flat(shape: tuple[int, ...], coords: list[str]) -> str:
    """Row-major offset of ``coords`` in a tile of ``shape``; size-1 dims contribute nothing."""
    terms = [c if st == 1 else f"{c} * {st}"
             for c, st, s in zip(coords, strides(shape), shape) if s != 1 and c != "0"]
    return " + ".join(terms) if terms else "0"


def coord_lines(shape: tuple[int, ...], e: str = "e", prefix: str = "c") -> tuple[list[str], list[str]]:
    """Declarations splitting flat index ``e`` into coordinates; returns (lines, coord exprs)."""
    lines, coords = [], []
    st = strides(shape)
    for d, s in enumerate(shape):
        if s == 1:
            coords.append("0")
            continue
        expr = e if st[d] == 1 else f"{e} / {st[d]}"
        if d > 0 and any(x != 1 for x in shape[:d]):
            expr = f"({expr}) % {s}"
        lines.append(f"const int {prefix}{d} = {expr};")
        coords.append(f"{prefix}{d}")
    return lines, coords


def broadcast(coords: list[str], out_shape: tuple[int, ...], shape: tuple[int, ...]) -> list[str]:
    """Operand coordinates for an output element under right-aligned numpy broadcasting."""
    lead = len(out_shape) - len(shape)
    return ["0" if s == 1 else coords[lead + i] for i, s in enumerate(shape)]


def float_literal(x: float) -> str:
    if math.isnan(x):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(x):
        return "__int_as_float(0x7f800000)" if x > 0 else "__int_as_float(0xff800000)"
    return f"{float(x)!r}f"


def base_expr(p: InputPlan, grid: tuple[int, int, int], forloop: int, it: str) -> str:
    """Element offset of the tile's first element in its source tensor (64-bit)."""
    terms = []
    for d, (S, st) in enumerate(zip(p.src_shape, strides(p.src_shape))):
        g = next((grid[a] for a in range(3) if p.imap[a] == d), 1)
        axis = next((a for a in range(3) if p.imap[a] == d), None)
        parts = []
        if axis is not None and g > 1:
            parts.append(f"(long long)blockIdx.{'xyz'[axis]} * {S // g}")
        if p.fmap == d and forloop > 1:
            parts.append(f"(long long)({it}) * {S // (g * forloop)}")
        for part in parts:
            terms.append(part if st == 1 else f"{part} * {st}")
    return " + ".join(terms) if terms else "0ll"


class Reader:
    """Renders reads of block values; knows the plan's storage decisions and the C names."""

    def __init__(self, plan: BlockPlan):
        self.plan = plan

    def read(self, name: str, coords: list[str]) -> str:
        plan = self.plan
        shape = plan.shape(name)
        if name in plan.inputs:
            p = plan.inputs[name]
            if p.staged:
                return f"ld_f(s_{identifier(name)}[{flat(shape, coords)}])"
            src_st = strides(p.src_shape)
            terms = [f"base_{identifier(name)}"] + [c if st == 1 else f"{c} * {st}"
                                                for c, st, s in zip(coords, src_st, shape)
                                                if s != 1 and c != "0"]
            return f"ld_f(a{p.source}[{' + '.join(terms)}])"
        if name in plan.inline:
            return self.expr(plan.nodes[name], coords)
        return f"t_{identifier(name)}[{flat(shape, coords)}]"

    def expr(self, n: Node, coords: list[str]) -> str:
        """The value of elementwise or structural node ``n`` at output ``coords``."""
        out = n.out.type.shape
        if n.op == "const":
            return float_literal(n.attr("value"))
        if n.op in UNARY_OPS:
            return f"op_{n.op}({self.read(n.args[0], broadcast(coords, out, self.plan.shape(n.args[0])))})"
        if n.op in BINARY_OPS:
            a, b = (self.read(x, broadcast(coords, out, self.plan.shape(x))) for x in n.args)
            return f"op_{n.op}({a}, {b})"
        if n.op == "cast":
            return f"rnd_{n.attr('dtype')}({self.read(n.args[0], coords)})"
        if n.op == "transpose":
            c = list(coords)
            c[-1], c[-2] = c[-2], c[-1]
            return self.read(n.args[0], c)
        if n.op == "slice":
            c = list(coords)
            d, start = n.attr("dim"), n.attr("start")
            c[d] = f"({c[d]} + {start})" if start else c[d]
            return self.read(n.args[0], c)
        if n.op == "concat":
            d = n.attr("dim")
            pieces, start = [], 0
            for a in n.args:
                size = self.plan.shape(a)[d]
                c = list(coords)
                c[d] = f"({coords[d]} - {start})" if start else coords[d]
                pieces.append((start + size, self.read(a, c)))
                start += size
            text = pieces[-1][1]
            for stop, val in reversed(pieces[:-1]):
                text = f"({coords[d]} < {stop} ? {val} : {text})"
            return text
        raise ValueError(f"no expression form for block op {n.op!r}")


BARRIER = "__syncthreads();"


class BlockText:
    """The lines of one block's CUDA code as they are written: indentation, braces, barriers and
    cooperative loops. ``KernelWriter`` (cuda_block) writes a whole kernel on it; the GEMV tiles
    (cuda_gemv) write their part through it, importing nothing above this module."""

    def __init__(self, b, plan: BlockPlan):
        self.b, self.plan = b, plan
        self.rd = Reader(plan)
        self.lines: list[str] = []
        self.depth = 1

    def w(self, *lines: str) -> None:
        self.lines.extend("  " * self.depth + ln for ln in lines)

    def barrier(self, why: str = "") -> None:
        """``__syncthreads()`` unless the previous statement already was one."""
        if not self.lines or self.lines[-1].strip().split("  //")[0] != BARRIER:
            self.w(BARRIER + (f"  // {why}" if why else ""))

    def open(self, head: str) -> None:
        self.w(head + " {")
        self.depth += 1

    def close(self, tail: str = "}") -> None:
        self.depth -= 1
        self.w(tail)

    def each(self, shape: tuple[int, ...], body, e: str = "e") -> None:
        """A cooperative loop over the elements of a tile; ``body(coords)`` writes its lines."""
        n = 1
        for s in shape:
            n *= s
        self.open(f"for (int {e} = tid; {e} < {n}; {e} += {self.b.block_threads})")
        decl, coords = coord_lines(shape, e)
        self.w(*decl)
        body(coords)
        self.close()
