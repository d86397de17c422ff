"""Render a μGraph's customized ops to Triton: one ``@triton.jit`` kernel (+ launcher) per op.

The kernel of a block graph (ir/graph.py) is the block graph itself, written out: one Triton
program per threadblock of the ``grid``; loop-invariant nodes before a ``for`` over the
``forloop`` range; inside it the fmap'd tile loads, the loop-variant nodes and the accumulators
in graph order (as ``interp.evaluate`` runs them); after it the nodes that read final values;
then one masked store per output, an atomic add where blocks must be summed (``reduce sum``).
Blocks summed into one output tile finish the sum themselves (``_Kernel.finish_sums``): each adds its
part into a float32 workspace and counts itself in; the last one of its tile reads the sum back,
resets the workspace and the counter to zero, and stores the sum in the output's dtype — one
launch, where a zeroing before and a cast after would be two more.

Numerics: tiles are loaded in their dtype and every op computes in float32; a matmul feeds
``tl.dot`` operands in the dtype the μGraph declares (tensor cores for fp16/bf16, exact IEEE
for fp32) and accumulates in float32; a ``cast`` to fp16/bf16 rounds through that dtype; stores
round to the output's dtype. Shapes, strides and offsets are baked in as constants (a μGraph is
static), which lets Triton prove alignment and issue 16-byte vector loads. Tiles are padded to
Triton's extents (``ir.padding``); masks keep padding out of reductions, dots and stores.

Library ops are not rendered: the runtime runs them as torch calls. This module imports no
triton and no torch; it only writes text.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass

from ..ir import (BlockGraph, Category, KernelGraph, Node, Variance, block_variance, default_stages, op_info,
                  reduced_axes)
from ..ir.chain import Chain, chains
from ..ir.padding import fma_matmul, padded_shapes

WGMMA_MIN_ROWS = 64  # a warpgroup's wgmma rows: a dot with fewer rows and at least this many columns is swapped
TL_DTYPES = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}
_UNARY = {
    "exp": "tl.exp({0})",
    "neg": "(-{0})",
    "square": "({0} * {0})",
    "sqrt": "tl.sqrt({0})",
    "rsqrt": "tl.rsqrt({0})",
    "sigmoid": "tl.sigmoid({0})",
    "silu": "({0} * tl.sigmoid({0}))",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
    "gelu_tanh": "(0.5 * {0} * (1.0 + (2.0 * tl.sigmoid(1.5957691216057308 * ({0} + 0.044715 * {0} * {0} * {0}))"
                 " - 1.0)))",
}
_BINARY = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
           "max": "tl.maximum({0}, {1})"}


@dataclass(frozen=True)
class KernelSpec:
    """One rendered kernel: which customized node it runs and how the runtime launches it."""

    name: str                  # the @triton.jit function
    launcher: str              # the python function that launches it (wrapped as a torch custom op)
    node_index: int            # position of the customized node in the kernel graph
    grid: tuple[int, int, int]
    args: tuple[str, ...]      # kernel-graph tensors read, in launcher order
    outs: tuple[str, ...]      # kernel-graph tensors written, in launcher order
    workspaces: tuple[int, ...]  # indices into ``outs`` that blocks sum (``_Kernel.finish_sums``) in a
                                 # float32 workspace w{j}
    num_warps: int             # defaults: block_threads / 32, and the most stages (≤ 3) whose shared
    num_stages: int            # memory estimate (ir.smem) fits sm_90; the profiler may change them
    paired: bool = False       # two instances in one launch: every pointer twice, the second set's
                               # programs at 1 on a grid axis the μGraph leaves at 1 (``render_triton``)
    counters: int = 0          # int32 counters ``c`` of the blocks done per summed output tile, then
                               # per group of a chain; zero before the first launch, and every
                               # launch leaves them (and the workspaces) so
    tail: int = -1             # the consumer node this kernel also runs (``ir.chain``), or -1: then
                               # ``args`` / ``outs`` continue with the consumer's

    def params(self) -> list[str]:
        """The launcher's tensor parameters, in order (one instance's; ``paired`` takes them twice)."""
        ins = [f"a{j}" for j in range(len(self.args))]
        outs = [f"o{j}" for j in range(len(self.outs))]
        return ins + outs + [f"w{j}" for j in self.workspaces] + (["c"] if self.counters else [])


def kernel_param_dtypes(spec: KernelSpec, g: KernelGraph) -> dict[str, str]:
    """The dtype of each pointer the kernel takes, by parameter name (``a0_ptr`` …), one instance's."""
    out = {f"a{j}_ptr": g.type_of(a).dtype for j, a in enumerate(spec.args)}
    out.update({f"o{j}_ptr": g.type_of(v).dtype for j, v in enumerate(spec.outs)})
    out.update({f"w{j}_ptr": "float32" for j in spec.workspaces})
    if spec.counters:
        out["c_ptr"] = "int32"
    return out


def launch_config(launch: dict | None, spec: KernelSpec) -> tuple[int, int, bool]:
    """(num_warps, num_stages, prefetch) of ``spec`` under a launch dict, whose values are
    (num_warps, num_stages) or (num_warps, num_stages, prefetch); the spec's defaults if absent."""
    v = (launch or {}).get(spec.name)
    if v is None:
        return spec.num_warps, spec.num_stages, False
    return int(v[0]), int(v[1]), len(v) > 2 and bool(v[2])


def prefetched(launch: dict | None) -> frozenset[str]:
    """The kernels a launch dict renders with prefetched loads (``render_triton``)."""
    return frozenset(k for k, v in (launch or {}).items() if len(v) > 2 and v[2])


def chained(launch: dict | None) -> frozenset[str]:
    """The kernels a launch dict renders running their consumer (a fourth element 1: ``render_triton``)."""
    return frozenset(k for k, v in (launch or {}).items() if len(v) > 3 and v[3])


@dataclass(frozen=True)
class TritonModule:
    name: str
    source: str
    kernels: list[KernelSpec]
    graph: KernelGraph


def render_triton(ugraph: KernelGraph, prefetch: frozenset[str] = frozenset(), paired: bool = False,
                  chain: frozenset[str] = frozenset()) -> TritonModule:
    """Render every customized op of ``ugraph``; library ops are left to the runtime.

    Kernels named in ``prefetch`` load the next iteration's tiles before this iteration's work
    (``_render_kernel``): a launch variant the profiler times like num_warps and num_stages.
    ``paired``: every kernel runs two instances of the graph in one launch (k_proj and v_proj of a
    layer: one program, two weights), taking each pointer twice (the second set suffixed ``_b``);
    the programs at 1 on a grid axis the μGraph does not use run the second instance, or, when
    every axis is cut, the upper half of a doubled x axis.
    ``chain``: kernels that also run their consumer, where ``ir.chain`` finds that legal (one
    launch for a split kernel and its combine); the consumer's kernel is then not rendered.
    Never with ``paired``."""
    base = _ident(ugraph.name)
    parts = ["import torch", "import triton", "import triton.language as tl",
             "from torch.library import wrap_triton", ""]
    legal = {} if paired or not chain else chains(ugraph)
    runs = {idx: c for idx, c in legal.items() if f"{base}_k{idx}" in chain}
    consumed = {c.consumer for c in runs.values()}
    kernels = []
    for idx, n in enumerate(ugraph.nodes):
        if n.op != "customized" or idx in consumed:
            continue
        name = f"{base}_k{idx}"
        spec, text = _render_kernel(name, idx, n, ugraph, name in prefetch, paired, runs.get(idx))
        kernels.append(spec)
        parts.append(text)
    return TritonModule(base, "\n".join(parts), kernels, ugraph)


def _ident(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else f"g_{s}"


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def _ar(p: int, d: int, rank: int) -> str:
    """tl.arange over dim ``d`` of a rank-``rank`` tile, with broadcast axes elsewhere."""
    r = f"tl.arange(0, {p})"
    if rank == 1:
        return r
    return r + "[" + ", ".join(":" if k == d else "None" for k in range(rank)) + "]"


def _mask(real: tuple[int, ...], pad: tuple[int, ...], dims=None) -> str | None:
    dims = range(len(real)) if dims is None else dims
    terms = [f"({_ar(pad[d], d, len(real))} < {real[d]})" for d in dims if pad[d] > real[d]]
    return " & ".join(terms) if terms else None


class _Kernel:
    """Text of one kernel body; ``self.var`` maps block value names to Triton variables."""

    def __init__(self, b: BlockGraph, narrow: str | None, prefix: str = "v", args: list[str] | None = None,
                 base: int = 0, fresh: frozenset[int] = frozenset()):
        """``prefix``: of its variables and block indices (``{prefix}pid0`` …); ``args``: the pointer
        of each node argument (default ``a{j}_ptr``); ``base``: indentation levels added to every
        line; ``fresh``: arguments this launch wrote (a chained consumer's, ``ir.chain``), loaded at
        L2 (``.cg``), never from an L1 line another launch left."""
        self.b = b
        self.narrow = narrow
        self.prefix, self.base, self.fresh = prefix, base, fresh
        self.args = args if args is not None else [f"a{j}_ptr" for j in range(1 + max((i.source for i in b.inputs),
                                                                                     default=-1))]
        self.pid = "pid" if prefix == "v" else f"{prefix}pid"
        self.producer = {n.out.name: n for n in b.nodes}
        self.pad = padded_shapes(b)
        self.real = {i.value.name: i.value.type.shape for i in b.inputs}
        self.real.update((n.out.name, n.out.type.shape) for n in b.nodes)
        self.dtype = {i.value.name: i.value.type.dtype for i in b.inputs}
        self.dtype.update((n.out.name, n.out.type.dtype) for n in b.nodes)
        self.var: dict[str, str] = {}
        self.native: set[str] = set()  # values held in their loaded dtype, not yet float32
        self.lines: list[str] = []
        self.skip = self._only_feed_dots(b) if narrow else set()
        # small-M matmuls written as a broadcast product + tl.sum (ir.padding.fma_matmul); one whose
        # B is transpose(w) reads w [N, K] as loaded (K contiguous) and the transpose is never emitted
        self.fma = {n.out.name for n in b.nodes if op_info(n.op).category is Category.MATMUL
                    and fma_matmul(self.real[n.args[0]], self.real[n.args[1]])}
        # small-M tl.dots accumulated over the loop, written as (Bᵀ·Aᵀ)ᵀ: accumulator -> the matmul
        self.swapped = _swapped_accums(b, self.producer, self.pad, self.fma)
        swapped_dots = {r.out.name for r in self.swapped.values()}
        self.nk: dict[str, str] = {}
        for n in b.nodes:
            t = self.producer.get(n.args[1]) if n.out.name in self.fma | swapped_dots else None
            if t is not None and t.op == "transpose" and len(self.real[t.args[0]]) == 2:
                self.nk[n.out.name] = t.args[0]
        readers: dict[str, set[str]] = {}
        for n in b.nodes:
            for a in n.args:
                readers.setdefault(a, set()).add(n.out.name)
        outs = {o.value for o in b.outputs}
        self.skip |= {w for m, src in self.nk.items() for w in [self.producer[m].args[1]]
                      if w not in outs and readers[w] <= set(self.nk)}
        # and the widening of w' that only those transposes read (the dots take w' as loaded)
        self.skip |= {n.out.name for n in b.nodes if n.op == "cast" and n.out.name not in outs
                      and readers.get(n.out.name) and readers[n.out.name] <= self.skip}

    def _only_feed_dots(self, b: BlockGraph) -> set[str]:
        """Widening casts read only by matmuls, directly or through transposes: the dots take the
        narrow value (transposed as it is, ``narrow_transposes``), so never emit them. Widening a
        K tile to float32 before ``tl.trans`` doubled the shared memory of the layout conversion and
        the registers that hold it (decode attention's [KV tile, d] K)."""
        readers: dict[str, list[Node]] = {}
        for n in b.nodes:
            for a in n.args:
                readers.setdefault(a, []).append(n)
        outs = {o.value for o in b.outputs}

        def dots_only(v: str) -> bool:
            return v not in outs and bool(readers.get(v)) and all(
                r.op == "matmul" or (r.op == "transpose" and dots_only(r.out.name)) for r in readers[v])
        return {n.out.name for n in b.nodes if n.op == "cast" and self.dtype[n.args[0]] in ("float16", "bfloat16")
                and dots_only(n.out.name)}

    def name(self, v: str) -> str:
        if v not in self.var:
            self.var[v] = f"{self.prefix}{len(self.var)}_{_ident(v)[:24]}"
        return self.var[v]

    def f32(self, v: str) -> str:
        native = v in self.native and self.dtype[v] != "float32"
        return f"{self.var[v]}.to(tl.float32)" if native else self.var[v]

    def emit(self, line: str, ind: int) -> None:
        self.lines.append("    " * (ind + self.base) + line)

    # ------------------------------------------------------------ loads and stores
    def load(self, inp, src_shape: tuple[int, ...], ind: int, it: str = "i", dst: str | None = None) -> None:
        """``inp``'s tile at for-loop iteration ``it`` (an expression) into ``dst`` (default: its variable)."""
        b, name = self.b, inp.value.name
        tile, pad = self.real[name], self.pad[name]
        terms = []
        for d, stride in enumerate(_strides(src_shape)):
            parts = [f"{self.pid}{a} * {src_shape[d] // b.grid[a]}" for a in range(3)
                     if inp.imap[a] == d and b.grid[a] > 1]
            if inp.fmap == d and b.forloop > 1:
                parts.append(f"{it} * {tile[d]}")
            idx = " + ".join(parts + [_ar(pad[d], d, len(tile))])
            terms.append(f"({idx})" + (f" * {stride}" if stride != 1 else ""))
        ptrs = f"{self.args[inp.source]} + " + " + ".join(terms)
        mask = _mask(tile, pad)
        args = f"{ptrs}, mask={mask}, other=0.0" if mask else ptrs
        if inp.source in self.fresh:
            args += ', cache_modifier=".cg"'
        self.emit(f"{dst or self.name(name)} = tl.load({args})", ind)
        self.native.add(name)

    def tile_ptrs(self, ptr: str, o, out_shape: tuple[int, ...]) -> tuple[str, str | None]:
        """(pointers, mask) of the block's tile of output ``o`` in the tensor at ``ptr``."""
        b = self.b
        tile, pad = self.real[o.value], self.pad[o.value]
        terms = []
        for d, stride in enumerate(_strides(out_shape)):
            parts = [f"{self.pid}{a} * {tile[d]}" for a in range(3) if o.omap[a] == d and b.grid[a] > 1]
            idx = " + ".join(parts + [_ar(pad[d], d, len(tile))])
            terms.append(f"({idx})" + (f" * {stride}" if stride != 1 else ""))
        return f"{ptr} + " + " + ".join(terms), _mask(tile, pad)

    def store(self, ptr: str, o, out_shape: tuple[int, ...], atomic: bool) -> None:
        ptrs, mask = self.tile_ptrs(ptr, o, out_shape)
        val = f"{self.f32(o.value)}.to({ptr}.dtype.element_ty)"
        fn = "tl.atomic_add" if atomic else "tl.store"
        args = [ptrs, val] + ([f"mask={mask}"] if mask else []) + (['sem="relaxed"'] if atomic else [])
        self.emit(f"{fn}({', '.join(args)})", 1)

    def finish_sums(self, summed: list[tuple[int, object, tuple[int, ...]]], reduced: tuple[int, ...],
                    first: int) -> None:
        """After the blocks of one tile of the outputs ``summed`` (all summed over grid axes
        ``reduced``) added their parts into workspaces ``w{j}``: the last of them to count itself in
        (counters from ``first`` on, one per tile) stores the sums into ``o{j}`` and leaves the
        workspaces and its counter zero.

        The barrier puts every thread's adds before the count; the count is an acquire-release
        atomic at GPU scope, so the last block's reads (atomic adds of zero, at L2 as the adds
        were, never a stale L1 line) see every other block's adds. No other block touches the
        workspace or the counter again in this launch, so plain stores reset them. The adds and
        the reads are relaxed atomics: the count alone orders them (CUTLASS's split-K semaphore
        is the same pattern). Triton's default, acq_rel on every one, makes each vector add a
        returning atomic that waits for the thread's earlier memory operations: a round trip to
        L2 per 16 bytes of partial sums, in series."""
        b = self.b
        group, stride = [], 1
        for a in range(3):
            if a not in reduced and b.grid[a] > 1:
                group.append(f"{self.pid}{a} * {stride}" if stride > 1 else f"{self.pid}{a}")
                stride *= b.grid[a]
        cnt = "c_ptr" + (f" + {first}" if first else "") + "".join(f" + {t}" for t in group)
        parts = math.prod(b.grid[a] for a in reduced)
        self.emit(f"if tl.atomic_add({cnt}, 1, sem=\"acq_rel\", scope=\"gpu\") == {parts - 1}:", 1)
        for j, o, shape in summed:
            ptrs, mask = self.tile_ptrs(f"w{j}_ptr", o, shape)
            m = f", mask={mask}" if mask else ""
            self.emit(f"sum{j} = tl.atomic_add({ptrs}, 0.0{m}, sem=\"relaxed\")", 2)
            self.emit(f"tl.store({ptrs}, 0.0{m})", 2)
            optrs, _ = self.tile_ptrs(f"o{j}_ptr", o, shape)
            self.emit(f"tl.store({optrs}, sum{j}.to(o{j}_ptr.dtype.element_ty){m})", 2)
        self.emit(f"tl.store({cnt}, 0)", 2)

    # ------------------------------------------------------------ nodes
    def operand(self, v: str, out: str) -> str:
        """``v`` in float32, squeezed where a padded extent-1 dim must broadcast (rare)."""
        x, rv, pv = self.f32(v), self.real[v], self.pad[v]
        po = self.pad[out]
        for i in range(1, len(rv) + 1):
            d = len(rv) - i
            if rv[d] == 1 and pv[d] > 1 and i <= len(po) and po[-i] != pv[d]:
                # real extent 1 padded for a dot elsewhere: keep element 0 only, as extent 1
                x = f"tl.sum(tl.where({_ar(pv[d], d, len(rv))} == 0, {x}, 0.0), axis={d}, keep_dims=True)"
        return x

    def node(self, n: Node, ind: int) -> None:
        out, cat = n.out.name, op_info(n.op).category
        if out in self.skip:
            return
        lhs = self.name(out)
        if cat is Category.CONST:
            self.emit(f"{lhs} = tl.full([], {_float(n.attr('value'))}, tl.float32)", ind)
        elif cat is Category.UNARY:
            self.emit(f"{lhs} = {_UNARY[n.op].format(self.f32(n.args[0]))}", ind)
        elif cat is Category.BINARY:
            a, c = (self.operand(x, out) for x in n.args)
            self.emit(f"{lhs} = {_BINARY[n.op].format(a, c)}", ind)
        elif cat is Category.REDUCE:
            src, dim = n.args[0], n.attr("dim")
            x = self.f32(src)
            m = _mask(self.real[src], self.pad[src], [dim])
            if m:
                fill = "0.0" if n.op == "reduce_sum" else '-float("inf")'
                x = f"tl.where({m}, {x}, {fill})"
            fn = "tl.sum" if n.op == "reduce_sum" else "tl.max"
            self.emit(f"{lhs} = {fn}({x}, axis={dim}, keep_dims={bool(n.attr('keepdim'))})", ind)
        elif cat is Category.MATMUL and out in self.fma:
            self.emit(f"{lhs} = {self.fma_sum(n, self.fma_product(n))}", ind)
        elif cat is Category.MATMUL:
            self.matmul(n, lhs, ind)
        elif n.op == "transpose":
            r = len(self.real[out])
            perm = "" if r == 2 else ", " + str(tuple(list(range(r - 2)) + [r - 1, r - 2]))
            fn = "tl.trans" if r == 2 else "tl.permute"
            src = n.args[0]
            if src in self.skip:  # a skipped widening: transpose the narrow tile the dots take
                src = self.unwidened(src)
                self.dtype[out] = self.dtype[src]
                self.native.add(out)
                self.emit(f"{lhs} = {fn}({self.var[src]}{perm})", ind)
            else:
                self.emit(f"{lhs} = {fn}({self.f32(src)}{perm})", ind)
        elif n.op == "cast":
            x, dt = self.f32(n.args[0]), n.attr("dtype")
            self.emit(f"{lhs} = {x}.to({TL_DTYPES[dt]}).to(tl.float32)" if dt in ("float16", "bfloat16")
                      else f"{lhs} = {x}", ind)
        else:
            raise NotImplementedError(f"render_triton: no Triton form for block op {n.op!r}")

    def dot_operand(self, v: str, kdim: int) -> str:
        """``v`` as a ``tl.dot`` operand: in the dtype the μGraph declares, padding along K zeroed."""
        if self.narrow:
            v = self.unwidened(v)
        rv, pv = self.real[v], list(self.pad[v])
        want = self.narrow or "float32"
        native = v in self.native
        x = self.var[v] if native else self.f32(v)
        m = _mask(rv, pv, [kdim])
        if m:  # padding along K must contribute nothing, whatever garbage it holds
            x = f"tl.where({m}, {x}, 0.0)"
        if want != "float32" and (not native or m or self.dtype[v] != want):
            x = f"{x}.to({TL_DTYPES[want]})"
        return x

    def swapped_dot(self, n: Node) -> str:
        """``matmul(a, b)``ᵀ [N, M] as ``tl.dot(bᵀ, aᵀ)``: a decode GEMV's few rows (M padded to 16)
        are the dot's N, the weight tile's columns its M, which makes the dot wgmma-eligible
        (64 rows a warpgroup) instead of mma.sync on 16; an [N, K] weight (b = transpose(w)) is
        the A operand as loaded. With the sum of squares of an RMSNorm in the same loop, the
        x·W form ran at half the weight-streaming rate on an H200 (``benchmarks/probe_small_m_dot.py``)."""
        a, b = n.args
        w = self.nk.get(n.out.name)
        lhs = self.dot_operand(w, 1) if w is not None else f"tl.trans({self.dot_operand(b, 0)})"
        prec = "" if self.narrow else ', input_precision="ieee"'
        return f"tl.dot({lhs}, tl.trans({self.dot_operand(a, 1)}), out_dtype=tl.float32{prec})"

    def matmul(self, n: Node, lhs: str, ind: int) -> None:
        """tl.dot on rank 2, or rank 3 with the batch dims flattened; unit batch dims dropped."""
        po = list(self.pad[n.out.name])
        batch = 1
        for e in po[:-2]:
            batch *= e
        ops = []
        for j, v in enumerate(n.args):
            x, pv = self.dot_operand(v, len(self.real[v]) - (1 if j == 0 else 2)), list(self.pad[v])
            if batch > 1 and (len(pv) < len(po) or pv[:-2] != po[:-2]):
                x = f"{x}[{', '.join(['None'] * (len(po) - len(pv)) + [':'] * len(pv))}]"
                x = f"tl.broadcast_to({x}, {po[:-2] + pv[-2:]})"
            if len(po) != 3 or batch == 1:
                x = f"tl.reshape({x}, {([batch] if batch > 1 else []) + pv[-2:]})" if len(pv) != 2 else x
            ops.append(x)
        prec = "" if self.narrow else ', input_precision="ieee"'
        dot = f"tl.dot({ops[0]}, {ops[1]}, out_dtype=tl.float32{prec})"
        if len(po) != 2 and (len(po) != 3 or batch == 1):
            dot = f"tl.reshape({dot}, {po})"
        self.emit(f"{lhs} = {dot}", ind)

    def fma_operand(self, v: str, kdim: int) -> str:
        """A float32 operand of a broadcast-product matmul, rounded as ``tl.dot`` would take it."""
        if self.narrow:
            v = self.unwidened(v)
        x = self.f32(v)
        if self.narrow and not (v in self.native and self.dtype[v] == self.narrow):
            x = f"{x}.to({TL_DTYPES[self.narrow]}).to(tl.float32)"
        m = _mask(self.real[v], self.pad[v], [kdim])
        return f"tl.where({m}, {x}, 0.0)" if m else x  # padding along K contributes nothing

    def fma_form(self, n: Node) -> str:
        """How the products of ``matmul(a, b)`` are laid out: in 2-D where a side is a single row.

        "row": b = transpose(w'), w' [N, K] with N == 1 (or M == N == 1): products a * w' [M, K].
        "col": b = transpose(w'), M == 1: products a * w' [N, K], the decode GEMV of an HF Linear.
        Both keep the loaded tiles' layout (no shared-memory layout conversion in the loop).
        "3d": [M, K, N] (or [M, N, K] for a transposed b), a broadcast over a third axis.
        """
        pm, pn = self.pad[n.out.name]
        if n.out.name in self.nk and pn == 1:
            return "row"
        if n.out.name in self.nk and pm == 1:
            return "col"
        return "3d"

    def fma_shape(self, n: Node) -> list[int]:
        """Padded shape of the elementwise products of ``matmul(a, b)``."""
        (pm, pk), pn = self.pad[n.args[0]], self.pad[n.out.name][1]
        form = self.fma_form(n)
        if form == "row":
            return [pm, pk]
        if form == "col":
            return [pn, pk]
        return [pm, pn, pk] if n.out.name in self.nk else [pm, pk, pn]

    def fma_product(self, n: Node) -> str:
        """The elementwise products of ``matmul(a, b)`` (see ``fma_form``)."""
        a, w = n.args
        ea = self.fma_operand(a, 1)
        form = self.fma_form(n)
        if n.out.name in self.nk:  # b = transpose(w'), w' [N, K]: out[m, n] = Σ_k a[m, k] w'[n, k]
            eb = self.fma_operand(self.nk[n.out.name], 1)
            return f"({ea}) * ({eb})" if form in ("row", "col") else f"({ea})[:, None, :] * ({eb})[None, :, :]"
        return f"({ea})[:, :, None] * ({self.fma_operand(w, 0)})[None, :, :]"

    def fma_sum(self, n: Node, products: str) -> str:
        """``matmul(a, b)`` [M, N] from its products: the sum over K."""
        form = self.fma_form(n)
        if form == "row":
            return f"tl.sum({products}, axis=1, keep_dims=True)"
        if form == "col":
            return f"tl.sum({products}, axis=1)[None, :]"
        return f"tl.sum({products}, axis={2 if n.out.name in self.nk else 1})"

    def unwidened(self, v: str) -> str:
        """The fp16/bf16 value a float32 ``v`` was cast from, if it was: the dot can take it exactly."""
        n = self.producer.get(v)
        while n is not None and n.op == "cast" and self.dtype[n.args[0]] in ("float16", "bfloat16"):
            v = n.args[0]
            n = self.producer.get(v)
        return v

    def accumulate(self, n: Node, ind: int) -> None:
        acc, x = self.var[n.out.name], self.f32(n.args[0])
        if n.op == "accum_sum":
            self.emit(f"{acc} = {acc} + {x}", ind)
        elif n.op == "accum_sum_sq":
            self.emit(f"{acc} = {acc} + {x} * {x}", ind)
        elif n.op == "accum_max":
            self.emit(f"{acc} = tl.maximum({acc}, {x})", ind)
        else:  # online-softmax rescale: acc·exp(m_prev − m) + x, m updated earlier this iteration
            m = n.args[1]
            self.emit(f"{acc} = {acc} * tl.exp({self.var[m]}_prev - {self.var[m]}) + {x}", ind)


def _float(v: float) -> str:
    v = float(v)
    if v != v:
        return 'float("nan")'
    if v in (float("inf"), float("-inf")):
        return f'{"-" if v < 0 else ""}float("inf")'
    return repr(v)


def _narrow(node: Node, g: KernelGraph) -> str | None:
    """The fp16/bf16 dtype a kernel's dots take: the first narrow dtype among its tensors."""
    io = [g.type_of(a).dtype for a in node.args] + [v.type.dtype for v in node.outs]
    return next((d for d in io if d in ("float16", "bfloat16")), None)


def _render_kernel(kname: str, idx: int, node: Node, g: KernelGraph, prefetch: bool = False,
                   paired: bool = False, chain: Chain | None = None) -> tuple[KernelSpec, str]:
    """One customized op as a @triton.jit kernel and its launcher.

    ``prefetch``: the loop's tiles are loaded one iteration ahead (iteration 0's before the loop,
    iteration i+1's — wrapping to 0 on the last, a harmless in-bounds reload — at the top of
    iteration i), so a tile's memory latency overlaps the previous iteration's work. Triton only
    software-pipelines loads that reach a ``tl.dot`` through shared memory; small-M decode GEMVs
    (a padded dot, operands in registers) otherwise wait a full latency every iteration.
    ``chain``: the kernel also runs its consumer in the last block of each group (``_emit_chained``);
    it takes the consumer's other arguments after its own and writes the consumer's outputs after
    its own."""
    b: BlockGraph = node.block
    k = _Kernel(b, _narrow(node, g))
    reduced = [reduced_axes(o, b.grid) for o in b.outputs]
    atomic = [bool(r) for r in reduced]
    # outputs summed over the same grid axes share counters: one per tile of theirs (the product
    # of the other axes), after those of the sets before
    sets = list(dict.fromkeys(r for r in reduced if r))
    tiles = [math.prod(n for a, n in enumerate(b.grid) if a not in r) for r in sets]
    args, outs = tuple(node.args), tuple(v.name for v in node.outs)
    if chain is not None:
        tail = g.nodes[chain.consumer]
        args += tuple(tail.args[s] for s in chain.extra_args)
        outs += tuple(v.name for v in tail.outs)
    spec = KernelSpec(kname, f"launch_{kname}", idx, tuple(b.grid), args, outs,
                      tuple(j for j, a in enumerate(atomic) if a), max(1, b.block_threads // 32),
                      default_stages(b) or 1, paired, sum(tiles) + (chain.groups if chain else 0),
                      chain.consumer if chain else -1)
    params = [f"{p_}_ptr" for p_ in spec.params()]
    grid = tuple(b.grid)
    pids = [a for a in range(3) if b.grid[a] > 1]
    if paired:
        free = next((a for a in range(3) if b.grid[a] == 1), None)
        if free is not None:  # the programs at 1 on an unused axis run the second instance
            grid = tuple(2 if a == free else n for a, n in enumerate(b.grid))
            k.emit(f"if tl.program_id({free}) == 1:  # the second instance: its own pointers", 1)
        else:  # every axis is cut: the upper half of axis 0 runs the second instance
            grid = (2 * b.grid[0], *b.grid[1:])
            k.emit("pid0 = tl.program_id(0)", 1)
            k.emit(f"if pid0 >= {b.grid[0]}:  # the second instance: its own pointers, the same blocks", 1)
            k.emit(f"pid0 -= {b.grid[0]}", 2)
            pids.remove(0)
        for p_ in params:
            k.emit(f"{p_} = {p_}_b", 2)
        params = params + [f"{p_}_b" for p_ in params]
    for a in pids:
        k.emit(f"pid{a} = tl.program_id({a})", 1)
    _emit_block(k, node, g, [f"w{j}_ptr" if atomic[j] else f"o{j}_ptr" for j in range(len(b.outputs))],
                atomic, prefetch)
    if sets:
        k.emit("tl.debug_barrier()", 1)
    for r, first in zip(sets, itertools.accumulate([0] + tiles)):
        k.finish_sums([(j, o, node.outs[j].type.shape) for j, o in enumerate(b.outputs) if reduced[j] == r], r, first)
    if chain is not None:
        _emit_chained(k, chain, g, len(node.args), len(node.outs), sum(tiles))
    body = "\n".join(k.lines) if k.lines else "    pass"
    text = f"@triton.jit\ndef {kname}({', '.join(params)}):\n{body}\n"
    spec = dataclasses.replace(spec, grid=grid)
    return spec, text + "\n" + _launcher(spec) + "\n"


def _emit_block(k: _Kernel, node: Node, g: KernelGraph, stores: list[str], atomic: list[bool],
                prefetch: bool) -> None:
    """The block graph of ``node`` from its loads to its stores (output j through pointer
    ``stores[j]``, added atomically where ``atomic[j]``), in ``k``'s indentation."""
    b: BlockGraph = node.block
    var = block_variance(b)
    arg_shapes = [g.type_of(a).shape for a in node.args]
    for inp in b.inputs:
        if inp.fmap == -1:
            k.load(inp, arg_shapes[inp.source], 1)
    accums = [n for n in b.nodes if op_info(n.op).category is Category.ACCUM]
    for n in b.nodes:
        if var[n.out.name] == Variance.PRE:
            k.node(n, 1)
    deferred = _deferred_sums(b, var, k.fma)
    for n in accums:
        init = '-float("inf")' if n.op == "accum_max" else "0.0"
        if n.out.name in deferred:
            r = deferred[n.out.name]
            shape = k.fma_shape(r) if r.op == "matmul" else list(k.pad[r.args[0]])
            k.emit(f"{k.name(n.out.name)}_el = tl.full({shape}, 0.0, tl.float32)", 1)
        elif n.out.name in k.swapped:
            k.emit(f"{k.name(n.out.name)}_t = tl.full({list(k.pad[n.out.name])[::-1]}, 0.0, tl.float32)", 1)
        else:
            k.emit(f"{k.name(n.out.name)} = tl.full({list(k.pad[n.out.name])}, {init}, tl.float32)", 1)
    rescaled_by = {n.args[1] for n in accums if n.op == "accum_sum_rescaled"}
    looped = [inp for inp in b.inputs if inp.fmap != -1]
    prefetch = prefetch and b.forloop > 1 and bool(looped)
    if prefetch:
        for inp in looped:
            k.load(inp, arg_shapes[inp.source], 1, it="0", dst=f"{k.name(inp.value.name)}_next")
    ind = 1
    if b.forloop > 1:
        k.emit(f"for i in range({b.forloop}):", 1)
        ind = 2
    for m in sorted(rescaled_by):
        k.emit(f"{k.var[m]}_prev = {k.var[m]}", ind)
    for inp in looped:
        if prefetch:
            v = k.var[inp.value.name]
            k.emit(f"{v} = {v}_next", ind)
            k.load(inp, arg_shapes[inp.source], ind, it=f"((i + 1) % {b.forloop})", dst=f"{v}_next")
        else:
            k.load(inp, arg_shapes[inp.source], ind)
    skipped = {r.out.name for r in (*deferred.values(), *k.swapped.values())}
    for n in b.nodes:
        if n.out.name in deferred:
            acc, r = f"{k.var[n.out.name]}_el", deferred[n.out.name]
            term = k.fma_product(r) if r.op == "matmul" else k.f32(r.args[0])
            k.emit(f"{acc} = {acc} + {term}", ind)
        elif n.out.name in k.swapped:
            acc = f"{k.var[n.out.name]}_t"
            k.emit(f"{acc} = {acc} + {k.swapped_dot(k.swapped[n.out.name])}", ind)
        elif op_info(n.op).category is Category.ACCUM:
            k.accumulate(n, ind)
        elif var[n.out.name] in (Variance.LOOP, Variance.RUNNING) and n.out.name not in skipped:
            k.node(n, ind)
    for name, r in deferred.items():
        if r.op == "matmul":  # K padding was zeroed in the products
            k.emit(f"{k.var[name]} = {k.fma_sum(r, k.var[name] + '_el')}", 1)
            continue
        src, dim = r.args[0], r.attr("dim")
        m = _mask(k.real[src], k.pad[src], [dim])
        x = f"tl.where({m}, {k.var[name]}_el, 0.0)" if m else f"{k.var[name]}_el"
        k.emit(f"{k.var[name]} = tl.sum({x}, axis={dim}, keep_dims={bool(r.attr('keepdim'))})", 1)
    for name in k.swapped:
        k.emit(f"{k.var[name]} = tl.trans({k.var[name]}_t)", 1)
    for n in b.nodes:
        if var[n.out.name] == Variance.POST and op_info(n.op).category is not Category.ACCUM:
            k.node(n, 1)
    for j, o in enumerate(b.outputs):
        k.store(stores[j], o, node.outs[j].type.shape, atomic[j])


def _emit_chained(k: _Kernel, chain: Chain, g: KernelGraph, n_args: int, n_outs: int, first: int) -> None:
    """After the producer's stores: each block counts itself in its group (counter ``first`` + the
    group's index over the matched axes); the last one runs the consumer's blocks of that group —
    block indices on matched axes are the producer's, free axes are looped — then resets the
    counter. The barrier and the acquire-release count order every block's stores before the last
    block's loads, which read at L2 (``.cg``), as ``finish_sums`` does."""
    tail = g.nodes[chain.consumer]
    group, stride = [], 1
    for _, a in sorted(chain.matched, key=lambda m: m[1]):
        group.append(f"pid{a} * {stride}" if stride > 1 else f"pid{a}")
        stride *= k.b.grid[a]
    cnt = "c_ptr" + (f" + {first}" if first else "") + "".join(f" + {t}" for t in group)
    k.emit("tl.debug_barrier()", 1)
    k.emit(f"if tl.atomic_add({cnt}, 1, sem=\"acq_rel\", scope=\"gpu\") == {chain.parts - 1}:", 1)
    ptr = {s: f"o{o}_ptr" for s, o in chain.from_producer}
    ptr.update((s, f"a{n_args + m}_ptr") for m, s in enumerate(chain.extra_args))
    t = _Kernel(tail.block, _narrow(tail, g), prefix="t", args=[ptr[s] for s in range(len(tail.args))],
                base=1, fresh=frozenset(s for s, _ in chain.from_producer))
    for b_axis, a_axis in chain.matched:
        t.emit(f"{t.pid}{b_axis} = pid{a_axis}", 1)
    for b_axis in chain.free:
        t.emit(f"for {t.pid}{b_axis} in range({tail.block.grid[b_axis]}):", 1)
        t.base += 1
    _emit_block(t, tail, g, [f"o{n_outs + j}_ptr" for j in range(len(tail.outs))], [False] * len(tail.outs), False)
    k.lines += t.lines
    k.emit(f"tl.store({cnt}, 0)", 2)


def _use_counts(b: BlockGraph) -> dict[str, int]:
    """How many times each value of ``b`` is read (by nodes and as an output)."""
    uses: dict[str, int] = {}
    for a in [a for n in b.nodes for a in n.args] + [o.value for o in b.outputs]:
        uses[a] = uses.get(a, 0) + 1
    return uses


def _swapped_accums(b: BlockGraph, producer: dict[str, Node], pad: dict[str, tuple[int, ...]],
                    fma: set[str]) -> dict[str, Node]:
    """accum_sum nodes fed only by a loop-variant rank-2 ``tl.dot`` of fewer than 64 (padded) rows
    and at least 64 columns, mapped to that matmul: the kernel accumulates the product
    transposed (``_Kernel.swapped_dot``) and transposes the sum once, after the loop."""
    var, uses = block_variance(b), _use_counts(b)
    out = {}
    for n in b.nodes:
        r = producer.get(n.args[0]) if n.op == "accum_sum" else None
        if (r is None or r.op != "matmul" or r.out.name in fma or uses[r.out.name] != 1
                or var[r.out.name] != Variance.LOOP or len(pad[r.out.name]) != 2):
            continue
        rows, cols = pad[r.out.name]
        if rows < WGMMA_MIN_ROWS <= cols:
            out[n.out.name] = r
    return out


def _deferred_sums(b: BlockGraph, var: dict[str, str], fma: set[str]) -> dict[str, Node]:
    """accum_sum nodes fed only by a loop-variant reduce_sum or broadcast-product matmul, mapped to it.

    Σ_i Σ_j x_ij = Σ_j Σ_i x_ij: the kernel adds the reduce's operand (the matmul's products)
    elementwise every iteration and reduces once after the loop, instead of a cross-warp reduction
    (shared memory and a barrier) per iteration: the RMSNorm sum of squares in a matmul's K loop,
    and the K loop of a decode GEMV, which then only streams its tiles.
    """
    producer = {n.out.name: n for n in b.nodes}
    uses = _use_counts(b)
    out = {}
    for n in b.nodes:
        r = producer.get(n.args[0]) if n.op == "accum_sum" else None
        summed = r is not None and (r.op == "reduce_sum" or r.out.name in fma)
        if summed and uses[r.out.name] == 1 and var[r.out.name] == Variance.LOOP:
            out[n.out.name] = r
    return out


def _launcher(spec: KernelSpec) -> str:
    """The python function the runtime registers as a torch custom op (``triton_op``): the kernel
    launched on its tensors as they are (workspaces and counters need no zeroing: ``KernelSpec``)."""
    params = spec.params()
    if spec.paired:  # the second instance's tensors, in the same order, suffixed _b
        params = params + [f"{x}_b" for x in params]
    sig = ", ".join(f"{p}: torch.Tensor" for p in params)
    return (f"def {spec.launcher}({sig}, num_warps: int, num_stages: int) -> None:\n"
            f"    wrap_triton({spec.name})[{spec.grid}]({', '.join(params)}, "
            f"num_warps=num_warps, num_stages=num_stages)\n")
