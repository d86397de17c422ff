"""GEMV tiles for decode shapes: ``[M,K] @ [K,N]`` with M ≤ 16, the rhs streamed from global memory.

Decode matmuls are memory bound: every weight element is used M ≤ 16 times, so what pays is
reading the weights once, 16 bytes per thread per load, coalesced across the warp, with several
loads in flight. Threads are laid out as CG column groups (V = 16 bytes of columns each — one column
where rows are not 16-byte aligned —, the fastest index, so a warp reads contiguous row segments) × KS slices of K. Each thread keeps M×V
float32 partial sums in registers; slices are combined with shared-memory ``atomicAdd``. A GEMV
feeding an ``accum_sum`` keeps its registers across the whole for-loop and adds them into the
accumulator once, after the loop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .cuda_expr import cname
from .cuda_plan import GemvPlan
from .cuda_prelude import C_TYPES

if TYPE_CHECKING:
    from .cuda_block import KernelWriter


def _k_loop(w: "KernelWriter", g: GemvPlan, acc: str, cg: str, ks: str) -> None:
    """acc[m][v] += A[m,k] · B[k, cg·V + v] over this thread's K slice."""
    p = w.plan.inputs[g.b]
    row = p.src_shape[1]
    b = cname(g.b)
    w.w(f"const int k0 = {ks} * {g.KC};", f"const int k1 = min({g.K}, k0 + {g.KC});",
        f"const {C_TYPES[p.dtype]}* __restrict__ bp = a{p.source} + base_{b} + {cg} * {g.V};")
    w.w("#pragma unroll 4")
    w.open("for (int k = k0; k < k1; ++k)")
    if g.V > 1:
        w.w(f"float bv[{g.V}];", f"unpack(ldg_stream(bp + (long long)k * {row}), bv, bp);")
    else:  # rows not 16-byte aligned: scalar loads, still coalesced across the column groups
        w.w(f"const float bv[1] = {{ld_f(bp[(long long)k * {row}])}};")
    w.w("#pragma unroll")
    w.open(f"for (int m = 0; m < {g.M}; ++m)")
    w.w(f"const float av = {w.rd.read(g.a, ['m', 'k'])};")
    w.w("#pragma unroll")
    w.w(f"for (int v = 0; v < {g.V}; ++v) {acc}[m][v] = fmaf(av, bv[v], {acc}[m][v]);")
    w.close()
    w.close()


def _zero_regs(w: "KernelWriter", g: GemvPlan, acc: str) -> None:
    w.w(f"float {acc}[{g.M}][{g.V}];", "#pragma unroll",
        f"for (int m = 0; m < {g.M}; ++m)", "#pragma unroll",
        f"  for (int v = 0; v < {g.V}; ++v) {acc}[m][v] = 0.0f;")


def _atomics(w: "KernelWriter", g: GemvPlan, acc: str, dst: str, cg: str) -> None:
    w.w("#pragma unroll", f"for (int m = 0; m < {g.M}; ++m)", "#pragma unroll",
        f"  for (int v = 0; v < {g.V}; ++v) atomicAdd({dst} + m * {g.N} + {cg} * {g.V} + v, {acc}[m][v]);")


def _zero_tile(w: "KernelWriter", name: str) -> None:
    shape = w.plan.shape(name)
    w.each(shape, lambda c: w.w(f"t_{cname(name)}[e] = 0.0f;"))


def gemv_prologue(w: "KernelWriter") -> None:
    """Registers and zeroed accumulators of the GEMVs that accumulate across the for-loop."""
    persistent = [g for g in w.plan.gemv.values() if g.into_accum]
    for g in persistent:
        n = cname(g.node.out.name)
        w.w(f"// %{g.node.out.name} = %{g.a} @ %{g.b}: [{g.M},{g.K}]x[{g.K},{g.N}], {g.CG} column groups "
            f"x {g.KS} k-slices, summed into %{g.into_accum} in registers")
        w.w(f"const int cg_{n} = tid % {g.CG};", f"const int ks_{n} = tid / {g.CG};")
        _zero_regs(w, g, f"acc_{n}")
        _zero_tile(w, g.into_accum)
    if persistent:
        w.barrier()


def gemv_flush(w: "KernelWriter") -> None:
    persistent = [g for g in w.plan.gemv.values() if g.into_accum]
    for g in persistent:
        n = cname(g.node.out.name)
        w.open(f"if (tid < {g.CG * g.KS})")
        _atomics(w, g, f"acc_{n}", f"t_{cname(g.into_accum)}", f"cg_{n}")
        w.close()
    if persistent:
        w.barrier()


def emit_gemv(w: "KernelWriter", g: GemvPlan) -> None:
    n = cname(g.node.out.name)
    if g.into_accum:
        w.open(f"if (tid < {g.CG * g.KS})")
        _k_loop(w, g, f"acc_{n}", f"cg_{n}", f"ks_{n}")
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
