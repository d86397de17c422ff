"""Probe: how should a decode GEMV with 2–16 rows be written as ``tl.dot``?

``y[M, N] = x[M, K] · Wᵀ`` with W [N, K] as ``nn.Linear`` holds it (K contiguous), M ≤ 16. Two forms:

- ``x·Wᵀ``: ``tl.dot(x, tl.trans(w))`` — M padded to 16, so Triton takes the mma.sync path (wgmma
  needs 64 rows a warpgroup); what the renderer emitted up to the fifteenth session.
- ``(W·xᵀ)ᵀ``: ``tl.dot(w, tl.trans(x))`` — the weight tile is the dot's A operand as loaded, its
  BN ≥ 64 rows make the dot wgmma-eligible, x is a 16-wide B; the [BN, 16] accumulator is
  transposed once, after the loop.

Prints µs per call (median of CUDA-event-timed CUDA-graph replays, weights rotated beyond L2) and
% of the copy bandwidth measured in the same run, with cuBLAS (``F.linear``) as the baseline.
    python benchmarks/probe_small_m_dot.py [--rows 8] [--k 4096] [--n 6144]
"""
from __future__ import annotations

import argparse
import itertools
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _x_wt(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for i in range(K // BK):
        x = tl.load(x_ptr + rm[:, None] * K + (i * BK + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + (i * BK + rk)[None, :], mask=rn[:, None] < N, other=0.0)
        acc += tl.dot(x, tl.trans(w))
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _w_xt(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN, BM], tl.float32)
    for i in range(K // BK):
        x = tl.load(x_ptr + rm[:, None] * K + (i * BK + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + (i * BK + rk)[None, :], mask=rn[:, None] < N, other=0.0)
        acc += tl.dot(w, tl.trans(x))
    out = tl.trans(acc)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], out.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def graph_us(fn, sets: int, reps: int = 20) -> float:
    """Median µs per call of ``fn(i)`` over CUDA-graph replays cycling ``sets`` input sets."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(sets):
            fn(i)
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / sets)
    return statistics.median(times)


def copy_gbs() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_us(lambda i: dst.copy_(src), 1)
    return 2 * src.numel() / us / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    M, K, N = a.rows, a.k, a.n
    sets = max(2, -(-200 * 2**20 // (N * K * 2)))  # weight sets: > 2x the 50-60 MB L2 each replay
    ws = [torch.randn(N, K, device="cuda", dtype=dt) * 0.02 for _ in range(sets)]
    xs = [torch.randn(M, K, device="cuda", dtype=dt) for _ in range(sets)]
    ys = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(sets)]
    copy = copy_gbs()
    nbytes = N * K * 2 + M * (K + N) * 2
    ref = torch.nn.functional.linear(xs[0].double(), ws[0].double())

    def row(name: str, us: float, err: float | None = None) -> None:
        gbs = nbytes / us / 1e3
        print(f"| {name} | {us:.1f} | {base / us:.2f}× | {gbs:.0f} | {100 * gbs / copy:.0f}% | "
              f"{'' if err is None else f'{err:.1e}'} |", flush=True)

    base = graph_us(lambda i: torch.nn.functional.linear(xs[i], ws[i], out=None), sets)
    print(f"rows {M}, K {K}, N {N}, {a.dtype}; copy {copy:.0f} GB/s; {sets} weight sets of {N * K * 2 / 1e6:.1f} MB")
    print("| kernel | µs | cuBLAS ÷ ours | GB/s | % copy BW | rel err |\n|---|---|---|---|---|---|")
    row("cuBLAS F.linear", base)
    kernels = {"x·Wᵀ": _x_wt, "(W·xᵀ)ᵀ": _w_xt}
    results = []
    for (name, kern), bn, bk, warps, stages in itertools.product(
            kernels.items(), (32, 64, 128), (64, 128, 256), (4, 8), (3, 4, 5)):
        if name == "(W·xᵀ)ᵀ" and bn < 64:
            continue
        if bn * bk * 2 * stages > 200 * 1024:
            continue
        grid = (triton.cdiv(N, bn),)
        bm = max(16, triton.next_power_of_2(M))

        def call(i, kern=kern, bn=bn, bk=bk, warps=warps, stages=stages, grid=grid, bm=bm):
            kern[grid](xs[i], ws[i], ys[i], M, N, K, bm, bn, bk, num_warps=warps, num_stages=stages)
        try:
            call(0)
            torch.cuda.synchronize()
            err = ((ys[0].double() - ref).norm() / ref.norm()).item()
            us = graph_us(call, sets)
        except Exception as e:  # out of resources: not a candidate
            print(f"| {name} bn{bn} bk{bk} w{warps}s{stages} | {type(e).__name__} | | | | |")
            continue
        results.append((us, name, bn, bk, warps, stages, err))
    results.sort()
    for us, name, bn, bk, warps, stages, err in results[:12]:
        row(f"{name} bn{bn} bk{bk} w{warps}s{stages}", us, err)
    for name in kernels:
        best = next(r for r in results if r[1] == name)
        print(f"best {name}: {best[0]:.1f} µs (bn{best[2]} bk{best[3]} w{best[4]}s{best[5]})")


if __name__ == "__main__":
    main()
