"""The text of one block graph inside a Triton kernel: its loads, ops, accumulators and stores.

``BlockWriter`` holds a kernel body's lines while ``codegen.triton`` walks a block graph through it
(``_emit_block``): each value becomes a Triton variable, each op a line, with the padding, masks and
layouts the module docstring of ``codegen.triton`` describes. A kernel that also runs its consumer
(``ir.chain``) writes the consumer's block with a second writer: its own variable prefix, pointers
and indentation. This module imports no triton and no torch; it only writes text.
"""
from __future__ import annotations

import math

from ..ir import DTYPE_BYTES, BlockGraph, Category, Node, Variance, block_variance, op_info
from ..ir.padding import WGMMA_MIN_ROWS, fma_matmul, padded_shapes
from ..ir.movement import view_shape
from .common import identifier, strides
from .triton_movement import moved_tile

TL_DTYPES = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32"}
# one L2 prefetch (``BlockWriter.l2_prefetch``); inline asm must give a result, so a dummy one
L2_PREFETCH_ASM = "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];"
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
    # ---- activations (issue 27, search-ops); erf from libdevice through tl.math
    "gelu": "(0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476)))",
    "erf": "tl.math.erf({0})",
    "relu": "tl.maximum({0}, 0.0)",
}
_BINARY = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
           "max": "tl.maximum({0}, {1})"}


def _viewed(idx: str, view: tuple, d: int) -> str:
    """The operand index a view index reads along dim ``d`` (``ir.movement``): the steps backwards."""
    for step in reversed(view):
        if step[1] == d:
            idx = f"{idx} + {step[2]}" if step[0] == "slice" else f"({idx}) // {step[2]}"
    return idx


def _ar(p: int, d: int, rank: int) -> str:
    """tl.arange over dim ``d`` of a rank-``rank`` tile, with broadcast axes elsewhere."""
    r = f"tl.arange(0, {p})"
    if rank == 1:
        return r
    return r + "[" + ", ".join(":" if k == d else "None" for k in range(rank)) + "]"


def tile_mask(real: tuple[int, ...], pad: tuple[int, ...], dims=None) -> str | None:
    dims = range(len(real)) if dims is None else dims
    terms = [f"({_ar(pad[d], d, len(real))} < {real[d]})" for d in dims if pad[d] > real[d]]
    return " & ".join(terms) if terms else None


class BlockWriter:
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
        self.args = args  # None: a{j}_ptr
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
        # pairs of such dots on one operand whose weight tiles are each too short for a warpgroup: one
        # swapped dot on the two tiles loaded as one (``stacked_load``, ``stacked_dot``)
        self.stacked = _stacked_pairs(b, self.producer, self.pad, self.real, self.fma)
        swapped_dots = {r.out.name for r in self.swapped.values()}
        swapped_dots |= {self.producer[n.args[0]].out.name for pair in self.stacked for n in pair}
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
            self.var[v] = f"{self.prefix}{len(self.var)}_{identifier(v)[:24]}"
        return self.var[v]

    def f32(self, v: str) -> str:
        native = v in self.native and self.dtype[v] != "float32"
        return f"{self.var[v]}.to(tl.float32)" if native else self.var[v]

    def emit(self, line: str, ind: int) -> None:
        self.lines.append("    " * (ind + self.base) + line)

    # ------------------------------------------------------------ loads and stores
    def pointer(self, inp) -> str:
        """The pointer argument ``inp``'s operand arrives in."""
        return self.args[inp.source] if self.args is not None else f"a{inp.source}_ptr"

    def _offsets(self, inp, src_shape: tuple[int, ...], it: str, lanes: dict[int, str] | None = None) -> str:
        """The element offsets of ``inp``'s tile at for-loop iteration ``it`` in its operand. ``lanes``: per
        dimension, an index expression in place of the tile's ``tl.arange`` along it."""
        b, name = self.b, inp.value.name
        tile, pad = self.real[name], self.pad[name]
        terms = []
        vshape = view_shape(src_shape, inp.view)  # tiles partition the view; strides are the operand's
        for d, stride in enumerate(strides(src_shape)):
            parts = [f"{self.pid}{a} * {vshape[d] // b.grid[a]}" for a in range(3)
                     if inp.imap[a] == d and b.grid[a] > 1]
            if inp.fmap == d and b.forloop > 1:
                parts.append(f"{it} * {tile[d]}")
            lane = (lanes or {}).get(d, _ar(pad[d], d, len(tile)))
            idx = _viewed(" + ".join(parts + [lane]), inp.view, d)
            terms.append(f"({idx})" + (f" * {stride}" if stride != 1 else ""))
        return " + ".join(terms)

    def l2_prefetch(self, inp, src_shape: tuple[int, ...], ind: int, line: int = 128) -> None:
        """Ask L2 (PTX ``prefetch.global.L2``) for every ``line``-byte line of ``inp``'s tile at iteration 0: one
        request a line of each of the tile's rows, none of them a load. A hint with no result: it changes no value
        and waits for nothing. ``inp`` is read in place (no view: ``codegen.triton``'s caller checks it), from an
        operand whose address is a multiple of ``line`` (a torch allocation's is); where a row's bytes may start
        inside a line, one more request, at its last element, covers the line it ends in. Lanes past the tile (its
        padding) ask for its last row or element again, never for a line the load does not read."""
        b, name = self.b, inp.value.name
        tile, pad = self.real[name], self.pad[name]
        last, size = len(tile) - 1, DTYPE_BYTES[self.dtype[name]]
        step = max(1, line // size)  # elements a line
        row_starts = [s * size for s in strides(src_shape)[:last]]
        row_starts += [src_shape[last] // b.grid[a] * size for a in range(3) if inp.imap[a] == last and b.grid[a] > 1]
        aligned = all(x % line == 0 for x in row_starts)
        n = -(-tile[last] // step) + (0 if aligned else 1)
        n = 1 << (n - 1).bit_length()  # tl.arange takes powers of two
        lanes = {d: f"tl.minimum({_ar(pad[d], d, len(tile))}, {tile[d] - 1})" for d in range(last) if pad[d] > tile[d]}
        lanes[last] = f"{_ar(n, last, len(tile))} * {step}"
        if (n - 1) * step > tile[last] - 1:  # lanes past a row's end ask for its last element's line (again)
            lanes[last] = f"tl.minimum({lanes[last]}, {tile[last] - 1})"
        ptr = self.pointer(inp)
        addr = f"{ptr}.to(tl.int64) + ({self._offsets(inp, src_shape, '0', lanes)}).to(tl.int64) * {size}"
        self.emit(f"tl.inline_asm_elementwise({L2_PREFETCH_ASM!r}, \"=r,l\", [{addr}], dtype=tl.int32, "
                  "is_pure=False, pack=1)", ind)

    def load(self, inp, src_shape: tuple[int, ...], ind: int, it: str = "i", dst: str | None = None) -> None:
        """``inp``'s tile at for-loop iteration ``it`` (an expression) into ``dst`` (default: its variable)."""
        name = inp.value.name
        tile, pad = self.real[name], self.pad[name]
        ptr = self.pointer(inp)
        ptrs = f"{ptr} + " + self._offsets(inp, src_shape, it)
        mask = tile_mask(tile, pad)
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
        for d, stride in enumerate(strides(out_shape)):
            parts = [f"{self.pid}{a} * {tile[d]}" for a in range(3) if o.omap[a] == d and b.grid[a] > 1]
            idx = " + ".join(parts + [_ar(pad[d], d, len(tile))])
            terms.append(f"({idx})" + (f" * {stride}" if stride != 1 else ""))
        return f"{ptr} + " + " + ".join(terms), tile_mask(tile, pad)

    def store(self, ptr: str, o, out_shape: tuple[int, ...], atomic: bool) -> None:
        ptrs, mask = self.tile_ptrs(ptr, o, out_shape)
        val = f"{self.f32(o.value)}.to({ptr}.dtype.element_ty)"
        fn = "tl.atomic_add" if atomic else "tl.store"
        args = [ptrs, val] + ([f"mask={mask}"] if mask else []) + (['sem="relaxed"'] if atomic else [])
        self.emit(f"{fn}({', '.join(args)})", 1)

    def finish_sums(self, summed: list[tuple[int, object, tuple[int, ...]]], reduced: tuple[int, ...],
                    first: int, ordered: bool = False) -> None:
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
        L2 per 16 bytes of partial sums, in series.

        ``ordered``: each block stored its part in a slot of its own (``part_index`` over ``reduced``, one output's
        elements apart) instead of adding it; the last block loads the slots at L2 (``.cg``) and adds them in slot
        order, so a launch's sums do not depend on which block came first. Every slot is written again on every
        launch before it is read: nothing to reset but the counter."""
        b = self.b
        parts = math.prod(b.grid[a] for a in reduced)
        cnt = self.count_in([a for a in range(3) if a not in reduced and b.grid[a] > 1], first, parts)
        for j, o, shape in summed:
            ptrs, mask = self.tile_ptrs(f"w{j}_ptr", o, shape)
            m = f", mask={mask}" if mask else ""
            if ordered:
                self.emit(f"sum{j} = tl.load({ptrs}{m}, cache_modifier=\".cg\")", 2)
                self.emit(f"for part{j} in tl.static_range(1, {parts}):", 2)
                slot, _ = self.tile_ptrs(f"(w{j}_ptr + part{j} * {math.prod(shape)})", o, shape)
                self.emit(f"sum{j} += tl.load({slot}{m}, cache_modifier=\".cg\")", 3)
            else:
                self.emit(f"sum{j} = tl.atomic_add({ptrs}, 0.0{m}, sem=\"relaxed\")", 2)
                self.emit(f"tl.store({ptrs}, 0.0{m})", 2)
            optrs, _ = self.tile_ptrs(f"o{j}_ptr", o, shape)
            self.emit(f"tl.store({optrs}, sum{j}.to(o{j}_ptr.dtype.element_ty){m})", 2)
        self.emit(f"tl.store({cnt}, 0)", 2)

    def part_index(self, axes: tuple[int, ...]) -> str:
        """This block's index over grid ``axes`` (the first varying fastest): its slot of an ordered sum."""
        terms, stride = [], 1
        for a in axes:
            terms.append(f"{self.pid}{a} * {stride}" if stride > 1 else f"{self.pid}{a}")
            stride *= self.b.grid[a]
        return " + ".join(terms)

    def count_in(self, axes: list[int], first: int, parts: int, ratios: list[int] | None = None) -> str:
        """Count this block in with an acquire-release atomic on counter ``first`` + its index over
        grid ``axes`` (one counter per combination of them; ``ratios[i]`` consecutive blocks of axis
        ``axes[i]`` share one), and open ``if`` it is the last of the ``parts`` blocks sharing that
        counter; returns the counter's pointer (to reset it)."""
        group, stride = [], 1
        for a, r in zip(axes, ratios or [1] * len(axes)):
            idx = f"({self.pid}{a} // {r})" if r > 1 else f"{self.pid}{a}"
            group.append(f"{idx} * {stride}" if stride > 1 else idx)
            stride *= self.b.grid[a] // r
        cnt = "c_ptr" + (f" + {first}" if first else "") + "".join(f" + {t}" for t in group)
        self.emit(f"if tl.atomic_add({cnt}, 1, sem=\"acq_rel\", scope=\"gpu\") == {parts - 1}:", 1)
        return cnt

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
            m = tile_mask(self.real[src], self.pad[src], [dim])
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
        elif n.op in ("concat", "slice", "permute"):
            self.emit(f"{lhs} = {moved_tile(n, [self.f32(a) for a in n.args], self.real, self.pad)}", ind)
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
        m = tile_mask(rv, pv, [kdim])
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

    def stacked_weights(self, pair: tuple[Node, Node]) -> tuple:
        """The two loaded weight inputs (``BlockGraph`` inputs) of a stacked pair, in its order."""
        names = [self.unwidened(self.nk[self.producer[n.args[0]].out.name]) for n in pair]
        return tuple(next(i for i in self.b.inputs if i.value.name == w) for w in names)

    def stacked_load(self, pair: tuple[Node, Node], src_shapes: list[tuple[int, ...]], it: str) -> str:
        """The two [N, K] weight tiles of ``pair`` at iteration ``it`` as one [2N, K] ``tl.load``: rows below N
        from the first weight, the rest from the second (a pointer select; neither tile is padded)."""
        a, b = self.stacked_weights(pair)
        n = self.pad[a.value.name][0]
        rows = _ar(2 * n, 0, 2)
        first = self._offsets(a, src_shapes[a.source], it, {0: f"tl.minimum({rows}, {n - 1})"})
        second = self._offsets(b, src_shapes[b.source], it, {0: f"tl.maximum({rows} - {n}, 0)"})
        return f"tl.load(tl.where({rows} < {n}, {self.pointer(a)} + {first}, {self.pointer(b)} + {second}))"

    def stacked_dot(self, pair: tuple[Node, Node], weights: str) -> str:
        """Both products of ``pair`` transposed, stacked [2N, M]: one ``tl.dot`` of the stacked tile ``weights``
        by the shared operand's transpose, of 2N ≥ 64 rows (wgmma) where each alone had N < 64."""
        a = self.producer[pair[0].args[0]].args[0]
        prec = "" if self.narrow else ', input_precision="ieee"'
        return f"tl.dot({weights}, tl.trans({self.dot_operand(a, 1)}), out_dtype=tl.float32{prec})"

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
        m = tile_mask(self.real[v], self.pad[v], [kdim])
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

    def rescale(self, name: str, scaled: tuple[Node, int]) -> None:
        """After the loop: accumulator ``name``, its sum deferred, scaled as the div or mul of ``scaled``
        (``scaled_sums``: the node and which of its operands is the sum) scaled each iteration's part."""
        scale, j = scaled
        parts = [self.var[name], self.operand(scale.args[1 - j], name)]
        self.emit(f"{self.var[name]} = {_BINARY[scale.op].format(*(parts if j == 0 else parts[::-1]))}", 1)

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
    transposed (``BlockWriter.swapped_dot``) and transposes the sum once, after the loop."""
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


def _stacked_pairs(b: BlockGraph, producer: dict[str, Node], pad: dict[str, tuple[int, ...]],
                   real: dict[str, tuple[int, ...]], fma: set[str]) -> list[tuple[Node, Node]]:
    """Pairs of accum_sum nodes that ``_swapped_accums`` left (each matmul's weight tile has N < 64 rows) whose
    matmuls share their left operand and take ``transpose(w)`` of a loaded, unpadded [N, K] weight tile of one
    shape, read by nothing else, with 2N ≥ 64: the kernel loads the two tiles as one [2N, K] tile and runs one
    swapped dot, wgmma-eligible, instead of two mma.sync dots on 16 rows (a gated MLP's gate and up,
    ``benchmarks/results/overlap_ceilings_h200_2026-11-28_s45``)."""
    var, uses = block_variance(b), _use_counts(b)
    loaded = {i.value.name for i in b.inputs if i.fmap != -1 and not i.view}  # read in place (``stacked_load``)
    groups: dict[tuple, list[Node]] = {}
    for n in b.nodes:
        r = producer.get(n.args[0]) if n.op == "accum_sum" else None
        if (r is None or r.op != "matmul" or r.out.name in fma or uses[r.out.name] != 1
                or var[r.out.name] != Variance.LOOP or len(pad[r.out.name]) != 2):
            continue
        t = producer.get(r.args[1])
        if t is None or t.op != "transpose" or uses[t.out.name] != 1:
            continue
        w, c = t.args[0], producer.get(t.args[0])
        while c is not None and c.op == "cast" and uses[w] == 1:  # the dot takes the loaded tile unwidened
            w, c = c.args[0], producer.get(c.args[0])
        rows, cols = pad[r.out.name]
        if (w not in loaded or uses[w] != 1 or len(real[w]) != 2 or real[w] != pad[w]
                or not rows < WGMMA_MIN_ROWS <= 2 * cols or cols >= WGMMA_MIN_ROWS):
            continue
        groups.setdefault((r.args[0], pad[w]), []).append(n)
    return [(g[k], g[k + 1]) for g in groups.values() for k in range(0, len(g) - 1, 2)]


def deferred_sums(b: BlockGraph, var: dict[str, str], fma: set[str],
                  scaled: dict[str, tuple[Node, int]]) -> dict[str, Node]:
    """accum_sum nodes fed only by a loop-variant reduce_sum or broadcast-product matmul, mapped to it; also those
    ``scaled`` (``scaled_sums``), mapped to the reduce under the scale.

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
        if n.out.name in scaled:  # the reduce under the scale
            s, j = scaled[n.out.name]
            r = producer[s.args[j]]
        summed = r is not None and (r.op == "reduce_sum" or r.out.name in fma)
        if summed and uses[r.out.name] == 1 and var[r.out.name] == Variance.LOOP:
            out[n.out.name] = r
    return out


def scaled_sums(b: BlockGraph, var: dict[str, str]) -> dict[str, tuple[Node, int]]:
    """accum_sum nodes fed only by ``div(r, c)``, ``mul(r, c)`` or ``mul(c, r)`` with ``r`` a loop-variant reduce_sum
    read only there and ``c`` loop-invariant, mapped to that div or mul and the index of ``r`` in it.
    Σ_i (r_i / c) = (Σ_i r_i) / c: the kernel defers r's sum like any other (``deferred_sums``) and scales it once
    after the loop (``BlockWriter.rescale``).
    A μGraph that divides an RMSNorm's sum of squares by K inside the loop otherwise pays a cross-warp reduction
    every iteration: Llama-3.2-1B's 8-row gate/up timed alone 27.6 µs so and 20.7 µs with the division after the
    sum (H200, benchmarks/results/overlap_ceilings_h200_2026-11-28_s45)."""
    producer = {n.out.name: n for n in b.nodes}
    uses = _use_counts(b)
    out = {}
    for n in b.nodes:
        s = producer.get(n.args[0]) if n.op == "accum_sum" else None
        if s is None or s.op not in ("div", "mul") or uses[s.out.name] != 1 or var[s.out.name] != Variance.LOOP:
            continue
        summed = [j for j, a in enumerate(s.args) if a in producer and producer[a].op == "reduce_sum"
                  and uses[a] == 1 and var[a] == Variance.LOOP]
        if not summed or (s.op == "div" and summed[0] != 0):  # c / r is no sum of parts
            continue
        other = s.args[1 - summed[0]]
        if var[other] == Variance.PRE:
            out[n.out.name] = (s, summed[0])
    return out
