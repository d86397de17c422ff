"""Probe: how should a decode GEMV with 2–16 rows be written as ``tl.dot``?

``y[M, N] = x[M, K] · Wᵀ`` (W [N, K] as ``nn.Linear`` holds it, K contiguous, or [K, N]), M ≤ 16:

- ``x·Wᵀ``: ``tl.dot(x, tl.trans(w))`` — M padded to 16: mma.sync (PTX of the AOT build for sm_90),
  what the renderer emitted up to the fifteenth session;
- ``(W·xᵀ)ᵀ``: ``tl.dot(w, tl.trans(x))`` — the weight tile's BN ≥ 64 rows are the dot's M, x a
  16-wide B: wgmma; the [BN, 16] accumulator is transposed once, after the loop.

Each also with an RMSNorm's sum of squares of x in the same loop (``rms``: summed elementwise and
reduced after the loop as the renderer does, reduced every iteration, or from a second load of x)
and with the weight tile widened to float32 before its transpose. Prints µs per call (median of
CUDA-event-timed CUDA-graph replays over input sets rotated beyond L2), % of the copy bandwidth
measured in the same run, and cuBLAS (``F.linear``, no RMSNorm) as the baseline.
    python benchmarks/probe_small_m_dot.py [--rows 8] [--k 4096] [--n 6144] [--only "x·Wᵀ;(W·xᵀ)ᵀ"]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, SWAP: tl.constexpr, NK: tl.constexpr, RMS: tl.constexpr, ROUNDTRIP: tl.constexpr):
    """y = x · Wᵀ (``NK``: W [N, K]) or x · W (W [K, N]); ``SWAP``: as (W·xᵀ)ᵀ. ``RMS``: also the sum
    of squares of x's rows, 1: summed elementwise into a [BM, BK] accumulator and reduced after the loop
    (what the renderer emits), 2: reduced every iteration, 3: as 1 from a second load of x. ``ROUNDTRIP``:
    the weight tile widened to float32, transposed, narrowed again before the dot."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN, BM] if SWAP else [BM, BN], tl.float32)
    sq_el = tl.zeros([BM, BK], tl.float32)
    sq = tl.zeros([BM, 1], tl.float32)
    for i in range(K // BK):
        xp = x_ptr + rm[:, None] * K + (i * BK + rk)[None, :]
        x = tl.load(xp, mask=rm[:, None] < M, other=0.0)
        if NK:
            w = tl.load(w_ptr + rn[:, None] * K + (i * BK + rk)[None, :])
            if ROUNDTRIP:
                w = tl.trans(w.to(tl.float32)).to(x.dtype)
            else:
                w = tl.trans(w)
        else:
            w = tl.load(w_ptr + (i * BK + rk)[:, None] * N + rn[None, :])
        if SWAP:
            acc += tl.dot(tl.trans(w), tl.trans(x))
        else:
            acc += tl.dot(x, w)
        if RMS == 1:
            xf = x.to(tl.float32)
            sq_el += xf * xf
        elif RMS == 2:
            xf = x.to(tl.float32)
            sq += tl.sum(xf * xf, axis=1, keep_dims=True)
        elif RMS == 3:
            xf = tl.load(xp, mask=rm[:, None] < M, other=0.0).to(tl.float32)
            sq_el += xf * xf
    out = tl.trans(acc) if SWAP else acc
    if RMS == 1 or RMS == 3:
        sq = tl.sum(sq_el, axis=1, keep_dims=True)
    if RMS:
        out = out * tl.rsqrt(sq / K + 1e-6)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], out.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


VARIANTS = {  # name: (SWAP, NK, RMS, ROUNDTRIP)
    "x·Wᵀ": (0, 1, 0, 0), "(W·xᵀ)ᵀ": (1, 1, 0, 0), "x·W [K,N]": (0, 0, 0, 0),
    "x·Wᵀ rms el": (0, 1, 1, 0), "x·Wᵀ rms row": (0, 1, 2, 0), "x·Wᵀ rms el reload": (0, 1, 3, 0),
    "x·Wᵀ rms el f32 trans": (0, 1, 1, 1), "(W·xᵀ)ᵀ rms el": (1, 1, 1, 0), "(W·xᵀ)ᵀ rms row": (1, 1, 2, 0),
    "x·W [K,N] rms el": (0, 0, 1, 0), "x·W [K,N] rms row": (0, 0, 2, 0), "(W·xᵀ)ᵀ [K,N] rms row": (1, 0, 2, 0),
}
LAUNCHES = [(bn, bk, w, s) for bn in (64,) for bk in (128, 256) for w in (2, 4, 8) for s in (3, 4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--only", default="", help="semicolon-separated variant names (default: all)")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    M, K, N = a.rows, a.k, a.n
    w_nk = torch.randn(N, K, device="cuda", dtype=dt) * 0.02
    inputs = [torch.randn(M, K, device="cuda", dtype=dt), w_nk, w_nk.t().contiguous(),
              torch.empty(M, N, device="cuda", dtype=dt)]
    sets = rotated_sets(inputs)
    copy = copy_bandwidth() / 1e9
    nbytes = N * K * 2 + M * (K + N) * 2
    x64 = inputs[0].double()
    plain = x64 @ w_nk.double().t()
    normed = (x64 * torch.rsqrt(x64.pow(2).mean(1, keepdim=True) + 1e-6)) @ w_nk.double().t()
    base = time_call(lambda x, w, wkn, y: torch.nn.functional.linear(x, w), sets)
    print(f"rows {M}, K {K}, N {N}, {a.dtype}; copy {copy:.0f} GB/s; {len(sets)} input sets")
    print("| kernel | best µs | launch (bn bk warps stages) | µs at bk256 w2s3 / w4s3 / w4s4 | cuBLAS ÷ best "
          "| % copy BW | rel err |\n|---|---|---|---|---|---|---|")
    print(f"| cuBLAS F.linear (no rms) | {base:.1f} | | | 1.00× | {100 * nbytes / base / 1e3 / copy:.0f}% | |")
    only = [v for v in a.only.split(";") if v] or list(VARIANTS)
    for name in only:
        swap, nk, rms, roundtrip = VARIANTS[name]
        ref = normed if rms else plain
        times, err = {}, None
        for bn, bk, warps, stages in LAUNCHES:
            def call(x, w, wkn, y, bn=bn, bk=bk, warps=warps, stages=stages):
                _gemv[(triton.cdiv(N, bn),)](x, w if nk else wkn, y, M, N, K, max(16, triton.next_power_of_2(M)),
                                            bn, bk, swap, nk, rms, roundtrip, num_warps=warps, num_stages=stages)
            try:
                call(*sets[0])
                torch.cuda.synchronize()
                e = ((sets[0][3].double() - ref).norm() / ref.norm()).item()
                err = e if err is None else max(err, e)
                times[(bn, bk, warps, stages)] = time_call(call, sets)
            except Exception:  # out of resources: not a candidate
                continue
        (bn, bk, warps, stages), best = min(times.items(), key=lambda kv: kv[1])
        at = " / ".join(f"{times[(64, 256, w, s)]:.1f}" if (64, 256, w, s) in times else "—"
                        for w, s in ((2, 3), (4, 3), (4, 4)))
        print(f"| {name} | {best:.1f} | {bn} {bk} {warps} {stages} | {at} | {base / best:.2f}× | "
              f"{100 * nbytes / best / 1e3 / copy:.0f}% | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
