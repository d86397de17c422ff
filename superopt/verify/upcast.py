"""Rewrite a μGraph so that it passes the dtype check: every arithmetic op the candidate computes
narrower than the program ever does (``precision.precision_violations``) is computed at the
program's width instead.

    fixed, changed = upcast(program, candidate)   # changed: the ops widened, [] if none

Deterministic and value-preserving in the formal model (casts are identities for the field test
and the float64 check), so the result verifies exactly when the candidate did; only rounding
changes, towards the program's. Inside each kernel's block graph, in order:

- an op of a checked kind (``precision.CHECKED``: square, div, rsqrt, the sums, ...) whose result
  is narrower than the program's narrowest of that kind is computed at that width, its narrower
  operands cast up first (one cast per value);
- an arithmetic op fed by a widened value is widened with it (operands of one op share a dtype),
  so the widening follows the data flow up to a cast, which then reads the wide value (a cast to
  the wide dtype itself disappears) — as HF's RMSNorm keeps ``x.float()²`` and its sum in float32;
- a block output whose value was widened is cast back to the dtype the kernel writes;
- a constant narrowed to a dtype the program never holds it in (rule 2 of
  ``precision.PrecisionFloor``: a narrowing cast of it disappears, a narrow declaration is made at
  the dtype the program holds it in) keeps its value as the program computes it, and the ops it feeds
  widen with it (the shipped Gemma-2 μGraphs rounded eps and 1/2304 to bfloat16, issue 32).

Kernel-level library ops are left alone (the shipped μGraphs' narrow ops are all inside kernels);
whatever is still too narrow afterwards is in ``precision_violations`` of the result.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import KernelGraph
from ..ir.graph import BlockGraph, Node, TensorType, Value, make_attrs
from ..ir.ops import DTYPE_BYTES
from .constants import constant_values
from .precision import CHECKED, PrecisionFloor, _kind, _narrowest, program_floor

_BY_BYTES = {4: "float32", 8: "float64", 2: None}   # the widths a program widens to


def upcast(program: KernelGraph, candidate: KernelGraph) -> tuple[KernelGraph, list[str]]:
    want = {k: _BY_BYTES.get(b) for k, b in _narrowest(program).items() if _BY_BYTES.get(b)}
    floor = program_floor(program)
    changed: list[str] = []
    nodes = []
    for n in candidate.nodes:
        if n.block is not None:
            block = _block(n.block, want, floor, changed)
            n = replace(n, block=block) if block is not n.block else n
        nodes.append(n)
    if not changed:
        return candidate, []
    return replace(candidate, nodes=tuple(nodes)), changed


def _block(b: BlockGraph, want: dict[str, str], floor: PrecisionFloor, changed: list[str]) -> BlockGraph:
    consts = constant_values(b.nodes)   # value -> the constant it is, before any rounding
    dtype = {i.value.name: i.value.type.dtype for i in b.inputs}
    alias: dict[str, str] = {}          # a dropped identity cast -> the value it read
    up: dict[tuple[str, str], str] = {}  # (value, dtype) -> the cast node computing it
    out: list[Node] = []
    dropped: set[str] = set()
    used = {i.value.name for i in b.inputs} | {n.out.name for n in b.nodes}
    fresh = iter(f"w{i}" for i in range(10**6) if f"w{i}" not in used)

    shapes = {i.value.name: i.value.type.shape for i in b.inputs}
    inputs = set(shapes)

    def cast_to(name: str, dt: str) -> str:
        if dtype[name] == dt:
            return name
        if (name, dt) not in up:
            v = Value(next(fresh), TensorType(shapes[name], dt))
            out.append(Node("cast", (name,), (v,), make_attrs(dtype=dt)))
            dtype[v.name] = dt
            up[(name, dt)] = v.name
        return up[(name, dt)]

    for n in b.nodes:
        args = tuple(alias.get(a, a) for a in n.args)
        v = n.out
        shapes[v.name] = v.type.shape
        if n.op == "cast":
            narrowed = v.name in consts and floor.too_narrow("cast", ("const", consts[v.name]), n.attr("dtype"),
                                                             [dtype[args[0]]])
            if narrowed:
                changed.append(f"cast %{v.name} of constant {consts[v.name]:g} to {v.type.dtype} removed")
            if narrowed or dtype[args[0]] == n.attr("dtype"):   # a widened value or constant stays wide
                alias[v.name] = args[0]
                dtype[v.name] = dtype[args[0]]
                dropped.add(v.name)
                continue
            out.append(replace(n, args=args))
            dtype[v.name] = v.type.dtype
            continue
        if n.op == "const":
            dt = floor.const_dtype(("const", consts[v.name]), v.type.dtype)
            if dt != v.type.dtype:
                changed.append(f"const %{v.name} {consts[v.name]:g} {v.type.dtype} -> {dt}")
                n = replace(n, attrs=make_attrs(**dict(n.attrs, dtype=dt)),
                            outs=(Value(v.name, TensorType(v.type.shape, dt)),))
            out.append(n)
            dtype[v.name] = dt
            continue
        wide = v.type.dtype
        goal = want.get(_kind(n.op)) if n.op in CHECKED else None
        if goal and DTYPE_BYTES[goal] > DTYPE_BYTES[wide]:
            wide = goal
        for a in args:   # fed by a widened value: widen with it
            if DTYPE_BYTES[dtype[a]] > DTYPE_BYTES[wide] and a not in inputs:
                wide = dtype[a]
        if wide == v.type.dtype:
            out.append(replace(n, args=args))
            dtype[v.name] = wide
            continue
        changed.append(f"{n.op} %{v.name} {v.type.dtype} -> {wide}")
        args = tuple(cast_to(a, wide) if DTYPE_BYTES[dtype[a]] < DTYPE_BYTES[wide] else a for a in args)
        out.append(replace(n, args=args, outs=(Value(v.name, TensorType(v.type.shape, wide)),)))
        dtype[v.name] = wide
    outputs = []
    orig = {i.value.name: i.value.type.dtype for i in b.inputs} | {n.out.name: n.out.type.dtype for n in b.nodes}
    for o in b.outputs:
        name = alias.get(o.value, o.value)
        if dtype[name] != orig[o.value]:   # the kernel still writes what it wrote
            c = Value(next(fresh), TensorType(shapes[o.value], orig[o.value]))
            out.append(Node("cast", (name,), (c,), make_attrs(dtype=orig[o.value])))
            dtype[c.name] = orig[o.value]
            name = c.name
        outputs.append(replace(o, value=name))
    if not changed and not dropped:
        return b
    groups = tuple(g2 for g2 in (tuple(alias.get(x, x) for x in g if x not in dropped) for g in b.thread_groups) if g2)
    return replace(b, nodes=tuple(out), outputs=tuple(outputs), thread_groups=groups)
