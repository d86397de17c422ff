"""GEMV tiles for decode shapes: ``[M,K] @ [K,N]`` with M ≤ 16, the rhs streamed from global memory.

Decode matmuls are memory bound: every weight element is used M ≤ 16 times, so what pays is
reading the weights once, 16 bytes per thread per load, coalesced across the warp, with several
loads in flight. Threads are laid out as CG column groups (V = 16 bytes of columns each — one column
where rows are not 16-byte aligned —, the fastest index, so a warp reads contiguous row segments) × KS slices of K. Each thread keeps M×V
float32 partial sums in registers; slices are combined with shared-memory ``atomicAdd``. A GEMV
feeding an ``accum_sum`` keeps its registers across the whole for-loop and adds them into the
accumulator once, after the loop; when its K slice is one batch of loads, it also issues the next
iteration's loads before this iteration's FMAs (register double-buffering of the weight stream).
"""
from __future__ import annotations

from .cuda_expr import BlockText, base_expr
from .cuda_plan import GemvPlan
from .cuda_prelude import C_TYPES
from .common import identifier

GEMV_UNROLL = 8  # rows of B loaded before the first FMA: 8 × 16 bytes in flight per thread


def _loads(w: BlockText, g: GemvPlan, dst: str, ptr: str, kb: str) -> None:
    """dst[u] = B row kb + u (16-byte vectors, or scalars), U rows issued back to back."""
    p = w.plan.inputs[g.b]
    U, exact = _unroll(g)
    guard = "" if exact else "if (k < k1) "
    load = (f"ldg_stream({ptr} + (long long)k * {p.src_shape[1]})" if g.V > 1
            else f"ld_f({ptr}[(long long)k * {p.src_shape[1]}])")
    w.w("#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{ const int k = {kb} + u; {guard}{dst}[u] = {load}; }}")


def _unroll(g: GemvPlan) -> tuple[int, bool]:
    """(U rows per batch of loads, whether every K slice is full so no bounds checks are needed)."""
    U = min(g.KC, GEMV_UNROLL)
    return U, g.KS * g.KC == g.K and g.KC % U == 0


def _prefetches(w: BlockText, g: GemvPlan) -> bool:
    """A register-accumulating GEMV whose K slice is one batch of loads issues the next iteration's
    loads before this iteration's FMAs, so the weight stream stays in flight across barriers."""
    return bool(g.into_accum) and g.KC <= GEMV_UNROLL and w.b.forloop > 1


def _bp(w: BlockText, g: GemvPlan, name: str, cg: str, it: str | None) -> str:
    p = w.plan.inputs[g.b]
    base = f"base_{identifier(g.b)}" if it is None else base_expr(p, w.b.grid, w.b.forloop, it)
    return f"const {C_TYPES[p.dtype]}* __restrict__ {name} = a{p.source} + {base} + {cg} * {g.V};"


def _k_loop(w: BlockText, g: GemvPlan, acc: str, cg: str, ks: str, prefetch: str | None = None) -> None:
    """acc[m][v] += A[m,k] · B[k, cg·V + v] over this thread's K slice, U rows of B in flight."""
    U, exact = _unroll(g)
    w.w(f"const int k0 = {ks} * {g.KC};")
    if not exact:
        w.w(f"const int k1 = min({g.K}, k0 + {g.KC});")
    w.w(_bp(w, g, "bp", cg, None))
    w.open(f"for (int kb = k0; kb < k0 + {g.KC}; kb += {U})")
    w.w(f"{'uint4' if g.V > 1 else 'float'} raw[{U}];")
    if prefetch:
        w.w("#pragma unroll", f"for (int u = 0; u < {U}; ++u) raw[u] = {prefetch}[u];")
        w.open(f"if (it + 1 < {w.b.forloop})")
        w.w(_bp(w, g, "bpn", cg, "it + 1"))
        _loads(w, g, prefetch, "bpn", "kb")
        w.close()
    else:
        _loads(w, g, "raw", "bp", "kb")
    w.w("#pragma unroll")
    w.open(f"for (int u = 0; u < {U}; ++u)")
    w.w("const int k = kb + u;")
    if not exact:
        w.w("if (k >= k1) break;")
    if g.V > 1:
        w.w(f"float bv[{g.V}];", "unpack(raw[u], bv, bp);")
    else:
        w.w("const float bv[1] = {raw[u]};")
    w.w("#pragma unroll")
    w.open(f"for (int m = 0; m < {g.M}; ++m)")
    w.w(f"const float av = {w.rd.read(g.a, ['m', 'k'])};")
    w.w("#pragma unroll")
    w.w(f"for (int v = 0; v < {g.V}; ++v) {acc}[m][v] = fmaf(av, bv[v], {acc}[m][v]);")
    w.close()
    w.close()
    w.close()


def _zero_regs(w: BlockText, g: GemvPlan, acc: str) -> None:
    w.w(f"float {acc}[{g.M}][{g.V}];", "#pragma unroll",
        f"for (int m = 0; m < {g.M}; ++m)", "#pragma unroll",
        f"  for (int v = 0; v < {g.V}; ++v) {acc}[m][v] = 0.0f;")


def _atomics(w: BlockText, g: GemvPlan, acc: str, dst: str, cg: str) -> None:
    w.w("#pragma unroll", f"for (int m = 0; m < {g.M}; ++m)", "#pragma unroll",
        f"  for (int v = 0; v < {g.V}; ++v) atomicAdd({dst} + m * {g.N} + {cg} * {g.V} + v, {acc}[m][v]);")


def _zero_tile(w: BlockText, name: str) -> None:
    shape = w.plan.shape(name)
    w.each(shape, lambda c: w.w(f"t_{identifier(name)}[e] = 0.0f;"))


def gemv_prologue(w: BlockText) -> None:
    """Registers and zeroed accumulators of the GEMVs that accumulate across the for-loop."""
    persistent = [g for g in w.plan.gemv.values() if g.into_accum]
    for g in persistent:
        n = identifier(g.node.out.name)
        w.w(f"// %{g.node.out.name} = %{g.a} @ %{g.b}: [{g.M},{g.K}]x[{g.K},{g.N}], {g.CG} column groups "
            f"x {g.KS} k-slices, summed into %{g.into_accum} in registers")
        w.w(f"const int cg_{n} = tid % {g.CG};", f"const int ks_{n} = tid / {g.CG};")
        _zero_regs(w, g, f"acc_{n}")
        _zero_tile(w, g.into_accum)
        if _prefetches(w, g):
            U, exact = _unroll(g)
            w.w(f"{'uint4' if g.V > 1 else 'float'} pf_{n}[{U}];  // iteration 0's rows of %{g.b}, in flight")
            w.open(f"if (tid < {g.CG * g.KS})")
            w.w(f"const int kb = ks_{n} * {g.KC};")
            if not exact:
                w.w(f"const int k1 = min({g.K}, kb + {g.KC});")
            w.w(_bp(w, g, "bp0", f"cg_{n}", "0"))
            _loads(w, g, f"pf_{n}", "bp0", "kb")
            w.close()
    if persistent:
        w.barrier()


def gemv_flush(w: BlockText) -> None:
    persistent = [g for g in w.plan.gemv.values() if g.into_accum]
    for g in persistent:
        n = identifier(g.node.out.name)
        w.open(f"if (tid < {g.CG * g.KS})")
        _atomics(w, g, f"acc_{n}", f"t_{identifier(g.into_accum)}", f"cg_{n}")
        w.close()
    if persistent:
        w.barrier()


def emit_gemv(w: BlockText, g: GemvPlan) -> None:
    n = identifier(g.node.out.name)
    if g.into_accum:
        w.open(f"if (tid < {g.CG * g.KS})")
        _k_loop(w, g, f"acc_{n}", f"cg_{n}", f"ks_{n}", f"pf_{n}" if _prefetches(w, g) else None)
        w.close()
        return
    w.w(f"// %{g.node.out.name} = %{g.a} @ %{g.b}: [{g.M},{g.K}]x[{g.K},{g.N}], {g.CG} column groups "
        f"x {g.KS} k-slices")
    _zero_tile(w, g.node.out.name)
    w.barrier()
    w.open(f"for (int wi = tid; wi < {g.CG * g.KS}; wi += {w.b.block_threads})")
    w.w(f"const int cg = wi % {g.CG};", f"const int ks = wi / {g.CG};")
    _zero_regs(w, g, "acc")
    _k_loop(w, g, "acc", "cg", "ks")
    _atomics(w, g, "acc", f"t_{n}", "cg")
    w.close()
    w.barrier()
