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
        [--bn 16,32,64] [--split 1,4]

``--bn`` sets the weight tile's rows (the grid is N ÷ bn blocks, times ``--split``); ``--split`` S > 1
cuts K into S slices, one block each, whose float32 sums are added into a float32 output with relaxed
atomics (zeroed for the check, not between timed calls: what a self-resetting workspace would cost, less
its counter and the cast back). ``--sets`` input sets (distinct weights) a timed graph replay: many make
each call's time what it is in a chain of dependent launches, not a replay's own start-up. ``fma`` sums
broadcast products instead of ``tl.dot`` (no tensor cores; summed elementwise, reduced after the loop).
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, SWAP: tl.constexpr, NK: tl.constexpr, RMS: tl.constexpr, ROUNDTRIP: tl.constexpr,
          SPLIT: tl.constexpr, FMA: tl.constexpr):
    """y = x · Wᵀ (``NK``: W [N, K]) or x · W (W [K, N]); ``SWAP``: as (W·xᵀ)ᵀ. ``RMS``: also the sum
    of squares of x's rows, 1: summed elementwise into a [BM, BK] accumulator and reduced after the loop
    (what the renderer emits), 2: reduced every iteration, 3: as 1 from a second load of x. ``ROUNDTRIP``:
    the weight tile widened to float32, transposed, narrowed again before the dot."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN, BM] if SWAP else [BM, BN], tl.float32)
    prods = tl.zeros([BM, BN, BK] if FMA else [1, 1, 1], tl.float32)
    sq_el = tl.zeros([BM, BK], tl.float32)
    sq = tl.zeros([BM, 1], tl.float32)
    per = K // BK // SPLIT
    for i in range(tl.program_id(1) * per, tl.program_id(1) * per + per):
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
        if FMA:  # w is [BK, BN] here (transposed above or loaded so)
            prods += x.to(tl.float32)[:, None, :] * tl.trans(w).to(tl.float32)[None, :, :]
        elif SWAP:
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
    if FMA:
        acc = tl.sum(prods, axis=2)
    out = tl.trans(acc) if SWAP else acc
    if RMS == 1 or RMS == 3:
        sq = tl.sum(sq_el, axis=1, keep_dims=True)
    if RMS:
        out = out * tl.rsqrt(sq / K + 1e-6)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT > 1:
        tl.atomic_add(y_ptr + rm[:, None] * N + rn[None, :], out, mask=mask, sem="relaxed")
    else:
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], out.to(y_ptr.dtype.element_ty), mask=mask)


VARIANTS = {  # name: (SWAP, NK, RMS, ROUNDTRIP[, FMA])
    "x·Wᵀ": (0, 1, 0, 0), "x·Wᵀ f32 trans": (0, 1, 0, 1), "fma": (0, 1, 0, 0, 1), "(W·xᵀ)ᵀ": (1, 1, 0, 0),
    "x·W [K,N]": (0, 0, 0, 0),
    "x·Wᵀ rms el": (0, 1, 1, 0), "x·Wᵀ rms row": (0, 1, 2, 0), "x·Wᵀ rms el reload": (0, 1, 3, 0),
    "x·Wᵀ rms el f32 trans": (0, 1, 1, 1), "(W·xᵀ)ᵀ rms el": (1, 1, 1, 0), "(W·xᵀ)ᵀ rms row": (1, 1, 2, 0),
    "x·W [K,N] rms el": (0, 0, 1, 0), "x·W [K,N] rms row": (0, 0, 2, 0), "(W·xᵀ)ᵀ [K,N] rms row": (1, 0, 2, 0),
}
BLOCK_SHAPES = [(bk, w, s) for bk in (256, 512) for w in (4, 8) for s in (3, 4)] + [(128, 4, 4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--only", default="", help="semicolon-separated variant names (default: all)")
    ap.add_argument("--bn", default="64", help="comma-separated weight-tile rows (default 64)")
    ap.add_argument("--split", default="1", help="comma-separated K splits (default 1)")
    ap.add_argument("--sets", type=int, default=0, help="input sets a replay (default: 2×L2 of them)")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    M, K, N = a.rows, a.k, a.n
    w_nk = torch.randn(N, K, device="cuda", dtype=dt) * 0.02
    inputs = [torch.randn(M, K, device="cuda", dtype=dt), w_nk, w_nk.t().contiguous(),
              torch.empty(M, N, device="cuda", dtype=dt), torch.empty(M, N, device="cuda", dtype=torch.float32)]
    per_set = sum(t.numel() * t.element_size() for t in inputs)
    sets = rotated_sets(inputs, min_bytes=a.sets * per_set if a.sets else None, max_sets=max(32, a.sets))
    copy = copy_bandwidth() / 1e9
    nbytes = N * K * 2 + M * (K + N) * 2
    x64 = inputs[0].double()
    plain = x64 @ w_nk.double().t()
    normed = (x64 * torch.rsqrt(x64.pow(2).mean(1, keepdim=True) + 1e-6)) @ w_nk.double().t()
    base = time_call(lambda x, w, wkn, y, y32: torch.nn.functional.linear(x, w), sets)
    print(f"rows {M}, K {K}, N {N}, {a.dtype}; copy {copy:.0f} GB/s; {len(sets)} input sets")
    print("| kernel | best µs | launch (bn split bk warps stages) | µs at bk256 w4s3 / w4s4 / w8s4 | cuBLAS ÷ best "
          "| % copy BW | rel err |\n|---|---|---|---|---|---|---|")
    print(f"| cuBLAS F.linear (no rms) | {base:.1f} | | | 1.00× | {100 * nbytes / base / 1e3 / copy:.0f}% | |")
    only = [v for v in a.only.split(";") if v] or list(VARIANTS)
    shapes = [(bn, split) for bn in map(int, a.bn.split(",")) for split in map(int, a.split.split(","))]
    for name, (bn, split) in [(n, sh) for n in only for sh in shapes]:
        swap, nk, rms, roundtrip, fma = (VARIANTS[name] + (0,))[:5]
        ref = normed if rms else plain
        times, err = {}, None
        bm = triton.next_power_of_2(M) if fma else max(16, triton.next_power_of_2(M))  # tl.dot needs 16
        for bk, warps, stages in BLOCK_SHAPES:
            if K % (bk * split) or (fma and bm * bn * bk > 64 * 32 * warps):
                continue  # K not cut evenly; an fma tile of more than 64 products a thread
            def call(x, w, wkn, y, y32, bk=bk, warps=warps, stages=stages):
                _gemv[(triton.cdiv(N, bn), split)](
                    x, w if nk else wkn, y32 if split > 1 else y, M, N, K, bm,
                    bn, bk, swap, nk, rms, roundtrip, split, fma, num_warps=warps, num_stages=stages)
            try:
                sets[0][4].zero_()
                call(*sets[0])
                torch.cuda.synchronize()
                got = sets[0][4 if split > 1 else 3].double()
                e = ((got - ref).norm() / ref.norm()).item()
                err = e if err is None else max(err, e)
                times[(bk, warps, stages)] = time_call(call, sets)
            except Exception:  # out of resources: not a candidate
                continue
        if not times:
            print(f"| {name} | — | {bn} {split} | no block shape ran | | | |", flush=True)
            continue
        (bk, warps, stages), best = min(times.items(), key=lambda kv: kv[1])
        at = " / ".join(f"{times[(256, w, s)]:.1f}" if (256, w, s) in times else "—"
                        for w, s in ((4, 3), (4, 4), (8, 4)))
        print(f"| {name} | {best:.1f} | {bn} {split} {bk} {warps} {stages} | {at} | {base / best:.2f}× | "
              f"{100 * nbytes / best / 1e3 / copy:.0f}% | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
