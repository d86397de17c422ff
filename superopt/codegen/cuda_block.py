"""Render one customized op (a block graph) as one CUDA ``__global__`` kernel.

Kernel shape (Mirage paper §3, ir.graph docstring): stage loop-invariant inputs, compute the
loop-invariant nodes, run the for-loop (stage this iteration's input tiles — the next one's in
flight by ``cp.async`` where double-buffered —, compute loop-variant nodes, update accumulators),
compute the post-loop nodes, store the outputs (``atomicAdd`` where blocks reduce). Every shared
tile is written by one cooperative loop ``for (e = tid; e < numel; e += threads)`` followed by a
barrier; thread-group members never reach shared memory, they are re-evaluated where read.
"""
from __future__ import annotations

from ..ir import BlockGraph, Node, TensorType, Variance
from ..ir.tiling import reduced_axes
from .cuda_expr import BlockText, base_expr, broadcast, coord_lines, flat
from .cuda_gemv import emit_gemv, gemv_flush, gemv_prologue
from .cuda_plan import InputPlan, is_accum, plan_block
from .cuda_prelude import C_TYPES
from .common import identifier, strides

WARP_REDUCE_MIN = 16  # reduced extent from which a warp (not a thread) computes each output
WARP_DOT_MIN = 128    # matmul K from which a warp computes each output (else a thread does)


class KernelWriter(BlockText):
    def __init__(self, name: str, b: BlockGraph, args: list[TensorType], outs: list[TensorType],
                 out_via_ws: list[bool]):
        super().__init__(b, plan_block(b, [t.shape for t in args]))
        self.name, self.args, self.outs, self.out_via_ws = name, args, outs, out_via_ws

    # ------------------------------------------------------------ the kernel
    def render(self) -> str:
        b, plan = self.b, self.plan
        params = [f"const {C_TYPES[t.dtype]}* __restrict__ a{i}" for i, t in enumerate(self.args)]
        for i, t in enumerate(self.outs):
            ct = "float" if self.out_via_ws[i] else C_TYPES[t.dtype]
            params.append(f"{ct}* __restrict__ o{i}")
        head = [f"// grid {b.grid}, {b.block_threads} threads, for-loop {b.forloop}, "
                f"{plan.smem_bytes} bytes of shared memory",
                f'extern "C" __global__ void __launch_bounds__({b.block_threads})',
                f"{self.name}({', '.join(params)}) {{"]
        self.w("extern __shared__ __align__(16) unsigned char smem[];", "const int tid = threadIdx.x;")
        self._declare_smem()
        if self._stage_inputs(pre=True):
            self.barrier()
        for n in b.nodes:
            if plan.var[n.out.name] == Variance.PRE:
                self._node(n)
        gemv_prologue(self)
        self._loop()
        gemv_flush(self)
        for n in b.nodes:
            if plan.var[n.out.name] == Variance.POST and not is_accum(n):
                self._node(n)
        self._outputs()
        return "\n".join(head + self.lines + ["}"])

    def _declare_smem(self) -> None:
        plan = self.plan
        for p in plan.inputs.values():
            ct = C_TYPES[p.dtype]
            if not p.staged:
                continue
            cast = f"reinterpret_cast<{ct}*>(smem + {p.smem_off})"
            if p.double:
                self.w(f"{ct}* const s_{identifier(p.name)}_buf = {cast};  // x2: double-buffered",
                       f"{ct}* s_{identifier(p.name)} = s_{identifier(p.name)}_buf;")
            else:
                self.w(f"{ct}* const s_{identifier(p.name)} = {cast};  // {list(p.tile)}")
        for name, off in plan.smem_off.items():
            self.w(f"float* const t_{identifier(name)} = reinterpret_cast<float*>(smem + {off});"
                   f"  // {list(plan.shape(name))}")
        for name, off in plan.prev_max.items():
            self.w(f"float* const pm_{identifier(name)} = reinterpret_cast<float*>(smem + {off});"
                   f"  // %{name} before this iteration")
        for p in plan.inputs.values():
            if not p.staged and p.fmap == -1:
                self.w(f"const long long base_{identifier(p.name)} = {base_expr(p, self.b.grid, self.b.forloop, '0')};")

    # ------------------------------------------------------------ input staging
    def _copy_tile(self, p: InputPlan, it: str, dst: str) -> None:
        base = base_expr(p, self.b.grid, self.b.forloop, it)
        src_st = strides(p.src_shape)
        n = 1
        for s in p.tile:
            n *= s
        V = p.vec
        self.open(f"for (int e = tid; e < {n // V}; e += {self.b.block_threads})")
        self.w(f"const int f = e * {V};" if V > 1 else "const int f = e;")
        decl, coords = coord_lines(p.tile, "f")
        self.w(*decl)
        terms = [base] + [c if st == 1 else f"{c} * {st}" for c, st, s in zip(coords, src_st, p.tile)
                          if s != 1 and c != "0"]
        src = f"a{p.source} + {' + '.join(terms)}"
        if V > 1:
            self.w(f"cp_async16({dst} + f, {src});")
        else:
            self.w(f"{dst}[f] = *({src});")
        self.close()

    def _stage_inputs(self, pre: bool) -> bool:
        """Copy this phase's single-buffered staged tiles into shared memory (no barrier)."""
        todo = [p for p in self.plan.inputs.values()
                if p.staged and (p.fmap == -1) == pre and not p.double]
        for p in todo:
            self._copy_tile(p, "it" if not pre else "0", f"s_{identifier(p.name)}")
        if any(p.vec > 1 for p in todo):
            self.w("cp_async_commit();", "cp_async_wait<0>();")
        return bool(todo)

    def _loop(self) -> None:
        b, plan = self.b, self.plan
        doubles = [p for p in plan.inputs.values() if p.double]
        for p in doubles:
            self._copy_tile(p, "0", f"s_{identifier(p.name)}_buf")
        if doubles:
            self.w("cp_async_commit();")
        self.open(f"for (int it = 0; it < {b.forloop}; ++it)")
        for p in plan.inputs.values():
            if not p.staged and p.fmap != -1:
                self.w(f"const long long base_{identifier(p.name)} = {base_expr(p, b.grid, b.forloop, 'it')};")
        if doubles:
            self.open(f"if (it + 1 < {b.forloop})")
            for p in doubles:
                n = _numel(p.tile)
                self._copy_tile(p, "it + 1", f"(s_{identifier(p.name)}_buf + ((it + 1) & 1) * {n})")
            self.w("cp_async_commit();", "cp_async_wait<1>();")
            self.close("} else {")
            self.depth += 1
            self.w("cp_async_wait<0>();")
            self.close()
            for p in doubles:
                self.w(f"s_{identifier(p.name)} = s_{identifier(p.name)}_buf + (it & 1) * {_numel(p.tile)};")
        for m in plan.prev_max:
            self.open("if (it > 0)")
            self.each(plan.shape(m), lambda c, m=m: self.w(
                f"pm_{identifier(m)}[{flat(plan.shape(m), c)}] = t_{identifier(m)}[{flat(plan.shape(m), c)}];"))
            self.close()
        if self._stage_inputs(pre=False) or doubles or plan.prev_max:
            self.barrier()
        for n in b.nodes:
            v = plan.var[n.out.name]
            if is_accum(n):
                self._accumulate(n)
            elif v in (Variance.LOOP, Variance.RUNNING):
                self._node(n)
        self.barrier("the next iteration overwrites this one's tiles")
        self.close()

    # ------------------------------------------------------------ nodes
    def _node(self, n: Node) -> None:
        plan, name = self.plan, n.out.name
        if name in plan.inline:
            return
        if name in plan.gemv:
            emit_gemv(self, plan.gemv[name])
            return
        shape, dst = n.out.type.shape, f"t_{identifier(name)}"
        if n.op in ("reduce_sum", "reduce_max") and self.plan.shape(n.args[0])[n.attr("dim")] >= WARP_REDUCE_MIN:
            self._warp_reduce(n, dst)
        elif n.op in ("reduce_sum", "reduce_max"):
            self.each(shape, lambda c: self._reduce(n, c, dst))
        elif n.op == "matmul" and self._warp_dot(n):
            self._warp_matmul(n, dst)
        elif n.op == "matmul":
            self.each(shape, lambda c: self._matmul(n, c, dst))
        else:
            self.each(shape, lambda c: self.w(f"{dst}[{flat(shape, c)}] = {self.rd.expr(n, c)};"))
        self.barrier()

    def _reduce(self, n: Node, coords: list[str], dst: str) -> None:
        """Thread per output for short reductions (the caller's element loop)."""
        a, d = n.args[0], n.attr("dim")
        src = list(coords)
        if n.attr("keepdim"):
            src[d] = "j"
        else:
            src.insert(d, "j")
        first = n.op == "reduce_sum"
        self.w("float r = 0.0f;" if first else "float r = __int_as_float(0xff800000);")
        self.open(f"for (int j = 0; j < {self.plan.shape(a)[d]}; ++j)")
        x = self.rd.read(a, src)
        self.w(f"r += {x};" if first else f"r = fmaxf(r, {x});")
        self.close()
        self.w(f"{dst}[{flat(n.out.type.shape, coords)}] = r;")

    def _warp_reduce(self, n: Node, dst: str) -> None:
        """Warp per output for long reductions: lanes stride the reduced dim, then shuffle."""
        a, d = n.args[0], n.attr("dim")
        shape, warps = n.out.type.shape, self.b.block_threads // 32
        numel = _numel(shape)
        first = n.op == "reduce_sum"
        self.open(f"for (int o = tid >> 5; o < {numel}; o += {warps})")
        decl, coords = coord_lines(shape, "o")
        self.w(*decl)
        src = list(coords)
        if n.attr("keepdim"):
            src[d] = "j"
        else:
            src.insert(d, "j")
        self.w("float r = 0.0f;" if first else "float r = __int_as_float(0xff800000);")
        self.open(f"for (int j = tid & 31; j < {self.plan.shape(a)[d]}; j += 32)")
        x = self.rd.read(a, src)
        self.w(f"r += {x};" if first else f"r = fmaxf(r, {x});")
        self.close()
        op = "r += __shfl_xor_sync(0xffffffffu, r, s);" if first else \
            "r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, s));"
        self.w("#pragma unroll", f"for (int s = 16; s > 0; s >>= 1) {op}")
        self.w(f"if ((tid & 31) == 0) {dst}[{flat(shape, coords)}] = r;")
        self.close()

    def _matmul(self, n: Node, coords: list[str], dst: str) -> None:
        """Generic batched matmul: one output element per thread, a dot product over K."""
        out = n.out.type.shape
        a, b = n.args
        sa, sb = self.plan.shape(a), self.plan.shape(b)
        ca = broadcast(coords[:-2], out[:-2], sa[:-2]) + [coords[-2], "k"]
        cb = broadcast(coords[:-2], out[:-2], sb[:-2]) + ["k", coords[-1]]
        self.w("float r = 0.0f;")
        self.open(f"for (int k = 0; k < {sa[-1]}; ++k)")
        self.w(f"r = fmaf({self.rd.read(a, ca)}, {self.rd.read(b, cb)}, r);")
        self.close()
        self.w(f"{dst}[{flat(out, coords)}] = r;")

    def _warp_dot(self, n: Node) -> bool:
        """Whether a warp (lanes splitting K) should compute each output: when K is long, or when
        the rhs is a transpose, whose column walk would put a warp's reads in one bank."""
        K = self.plan.shape(n.args[0])[-1]
        rhs = self.plan.nodes.get(n.args[1])
        return K >= WARP_DOT_MIN or (rhs is not None and rhs.op == "transpose" and K >= WARP_REDUCE_MIN)

    def _warp_matmul(self, n: Node, dst: str) -> None:
        out = n.out.type.shape
        a, b = n.args
        sa, sb = self.plan.shape(a), self.plan.shape(b)
        self.open(f"for (int o = tid >> 5; o < {_numel(out)}; o += {self.b.block_threads // 32})")
        decl, coords = coord_lines(out, "o")
        self.w(*decl)
        ca = broadcast(coords[:-2], out[:-2], sa[:-2]) + [coords[-2], "k"]
        cb = broadcast(coords[:-2], out[:-2], sb[:-2]) + ["k", coords[-1]]
        self.w("float r = 0.0f;")
        self.open(f"for (int k = tid & 31; k < {sa[-1]}; k += 32)")
        self.w(f"r = fmaf({self.rd.read(a, ca)}, {self.rd.read(b, cb)}, r);")
        self.close()
        self.w("#pragma unroll", "for (int s = 16; s > 0; s >>= 1) r += __shfl_xor_sync(0xffffffffu, r, s);")
        self.w(f"if ((tid & 31) == 0) {dst}[{flat(out, coords)}] = r;")
        self.close()

    def _accumulate(self, n: Node) -> None:
        plan, name = self.plan, n.out.name
        x = n.args[0]
        if x in plan.gemv and plan.gemv[x].into_accum == name:
            return  # the GEMV adds into this accumulator from registers after the loop
        shape, dst = n.out.type.shape, f"t_{identifier(name)}"

        def body(c: list[str]) -> None:
            i = flat(shape, c)
            v = self.rd.read(x, c)
            if n.op == "accum_sum":
                self.w(f"{dst}[{i}] = (it == 0 ? 0.0f : {dst}[{i}]) + {v};")
            elif n.op == "accum_sum_sq":
                self.w(f"const float v = {v};", f"{dst}[{i}] = (it == 0 ? 0.0f : {dst}[{i}]) + v * v;")
            elif n.op == "accum_max":
                self.w(f"const float v = {v};", f"{dst}[{i}] = it == 0 ? v : fmaxf({dst}[{i}], v);")
            else:  # accum_sum_rescaled: acc * exp(m_prev - m) + x
                m = n.args[1]
                mi = flat(plan.shape(m), broadcast(c, shape, plan.shape(m)))
                self.w(f"const float v = {v};",
                       f"{dst}[{i}] = it == 0 ? v : {dst}[{i}] * expf(pm_{identifier(m)}[{mi}] - t_{identifier(m)}[{mi}]) + v;")
        self.each(shape, body)
        self.barrier()

    # ------------------------------------------------------------ outputs
    def _outputs(self) -> None:
        for i, (o, t) in enumerate(zip(self.b.outputs, self.outs)):
            tile = self.plan.shape(o.value)
            out_st = strides(t.shape)
            reduce = bool(reduced_axes(o, self.b.grid))

            def body(c: list[str], i=i, o=o, t=t, tile=tile, out_st=out_st, reduce=reduce) -> None:
                terms = []
                for d, (cd, st) in enumerate(zip(c, out_st)):
                    axis = next((a for a in range(3) if o.omap[a] == d and self.b.grid[a] > 1), None)
                    idx = cd if axis is None else (f"blockIdx.{'xyz'[axis]} * {tile[d]}"
                                                   + ("" if cd == "0" else f" + {cd}"))
                    if idx != "0":
                        terms.append(f"(long long)({idx})" if st == 1 else f"(long long)({idx}) * {st}")
                off = " + ".join(terms) if terms else "0"
                v = self.rd.read(o.value, c)
                if reduce:
                    self.w(f"atomicAdd(o{i} + {off}, {v});")
                else:
                    self.w(f"o{i}[{off}] = st_f<{C_TYPES[t.dtype]}>({v});")
            self.each(tile, body)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
