"""Probe: how close to the copy bandwidth can a one-row decode GEMV get at a block's size?

Issue 4 asks the memory-bound Llama-3-8B blocks at batch 1 for 85% of the 1 GiB copy bandwidth;
the searched kernels reach 76–81% on qkv (50 MB) and o+res (34 MB), 96–102% on the 117–235 MB MLP
blocks. This prints, for ``y[1, N] = x[1, K] · Wᵀ`` (W [N, K] bf16, as ``nn.Linear`` holds it), each
graph-replayed over inputs rotated beyond L2 as ``bench_blocks`` times:

- a device-to-device copy of the same bytes (half read, half written);
- ``read``: a Triton kernel that only streams W and sums it (no x, no output traffic): what a
  kernel of this grid can read;
- ``gemv``: the same loop with x, one output row — program (n tile, K part) over ``BN`` rows and
  ``K / S`` columns in ``BK`` slices; S > 1 adds float32 partial sums atomically (the timing's
  outputs are not zeroed between calls: the probe times, ``--check`` checks one call);
- cuBLAS (``F.linear``).
The best launches of each family, and % of the copy bandwidth measured in the same run.

    python benchmarks/probe_gemv_ceiling.py [--n 6144] [--k 4096] [--top 6] [--check]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from superopt.runtime.timing import copy_bandwidth, rotated_sets, same_size_copy_us, time_call


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, S: tl.constexpr,
          READ_ONLY: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros([BN, BK], tl.float32)
    for i in range(K // S // BK):
        rk = pid_k * (K // S) + i * BK + tl.arange(0, BK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :]).to(tl.float32)
        if READ_ONLY:
            acc += w
        else:
            acc += w * tl.load(x_ptr + rk).to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    if S == 1:
        tl.store(y_ptr + rn, y)
    else:
        tl.atomic_add(y_ptr + rn, y, sem="relaxed")


def gemv(n: int, k: int, bn: int, bk: int, s: int, warps: int, stages: int, read_only: bool):
    y = torch.zeros(n, device="cuda", dtype=torch.float32)

    def call(x, w):
        _gemv[(n // bn, s)](x, w, y, K=k, BN=bn, BK=bk, S=s, READ_ONLY=read_only, num_warps=warps,
                            num_stages=stages)
        return y
    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6144)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--top", type=int, default=6, help="launches printed per family")
    ap.add_argument("--check", action="store_true", help="check one call of each unsplit GEMV against float64")
    args = ap.parse_args()
    n, k = args.n, args.k
    x = torch.randn(1, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    nbytes = (n * k + k + n) * 2
    bw = copy_bandwidth()
    copy = same_size_copy_us(nbytes)
    sets = rotated_sets([x, w])
    print(f"device: {torch.cuda.get_device_name()}; triton {triton.__version__}; copy bandwidth {bw / 1e12:.2f} TB/s; "
          f"y[1, {n}] = x[1, {k}] · Wᵀ, bf16: {nbytes / 1e6:.1f} MB, floor {nbytes / bw * 1e6:.2f} µs\n")
    print("| kernel | launch | graph µs | % copy BW | ÷ same-size copy |\n|---|---|---|---|---|")

    def line(what: str, launch: str, us: float) -> None:
        print(f"| {what} | {launch} | {us:.2f} | {100 * nbytes / (us * 1e-6) / bw:.0f}% | {us / copy:.2f}× |", flush=True)

    line("copy of the same bytes", "torch", copy)
    line("cuBLAS F.linear", "torch", time_call(lambda a, b: torch.nn.functional.linear(a, b), sets))
    grid = [(bn, bk, s, wp, st) for bn, bk, s, wp, st in itertools.product((8, 16, 32, 64), (256, 512), (1, 2, 4),
                                                                         (4, 8), (1, 3))
            if n % bn == 0 and k % (s * bk) == 0 and bn * bk <= 16384]
    for read_only in (True, False):
        timed = []
        for bn, bk, s, wp, st in grid:
            call = gemv(n, k, bn, bk, s, wp, st, read_only)
            try:
                if args.check and not read_only and s == 1:  # split-K outputs accumulate over calls
                    ref = (x.double() @ w.double().T)[0]
                    err = float((call(x, w).double() - ref).norm() / ref.norm())
                    assert err < 1e-2, (bn, bk, s, err)
                timed.append((time_call(call, sets), (bn, bk, s, wp, st)))
            except Exception as e:  # e.g. out of registers at a wide tile: not a candidate
                print(f"  skipped bn{bn} bk{bk} S{s} w{wp}s{st}: {type(e).__name__}: {str(e)[:80]}", flush=True)
        for us, (bn, bk, s, wp, st) in sorted(timed)[:args.top]:
            blocks = (n // bn) * s
            line("read W only" if read_only else "GEMV", f"BN {bn} BK {bk} S {s} ({blocks} blocks) w{wp}s{st}", us)


if __name__ == "__main__":
    main()
