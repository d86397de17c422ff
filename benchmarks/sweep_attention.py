"""Launch plans of the hand-written decode-attention kernels, timed at bench_blocks' attention shapes.

    python benchmarks/sweep_attention.py [--only "attn 4k b1"]

For each shape: every ``LaunchPlan`` (waves of programs, cache positions per iteration, warps,
pipeline stages), one call replayed in a CUDA graph over inputs rotated beyond L2, as a share of
the copy bandwidth measured in the same run; the default plan is marked. What the split plan of
``attention_launch`` should be is read off this table, not guessed.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.profile_attention import attention_rows, handwritten
from mirage_serve.decode.attention_launch import DEFAULT_PLAN, LaunchPlan
from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="attn", help="comma-separated substrings of bench_blocks' row labels")
    ap.add_argument("--waves", default="1,2,4,8")
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--top", type=int, default=5, help="plans printed per shape (the default always)")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    plans = [LaunchPlan(*p) for p in itertools.product(ints(args.waves), ints(args.block_n), ints(args.warps),
                                                       ints(args.stages))]
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s; {len(plans)} plans\n")
    print("| row | plan (waves, block_n, warps, stages) | graph µs | % copy BW | vs default |")
    print("|---|---|---|---|---|")
    for label, _, kw, dt in attention_rows(args.only):
        timed = {}
        for plan in plans:
            fn, xs = handwritten(kw, getattr(torch, dt), plan)
            try:
                timed[plan] = time_call(fn, rotated_sets(xs), graph=True)
            except Exception as e:  # a plan Triton cannot build (registers, shared memory): skip it
                print(f"  {label} {plan}: {type(e).__name__}: {str(e)[:100]}", flush=True)
        nbytes = sum(x.numel() * x.element_size() for x in xs)
        base = timed.get(DEFAULT_PLAN)
        ranked = sorted(timed, key=timed.get)
        for plan in ranked[:args.top] + ([DEFAULT_PLAN] if DEFAULT_PLAN not in ranked[:args.top] else []):
            us = timed[plan]
            mark = " (default)" if plan == DEFAULT_PLAN else ""
            print(f"| {label} | {plan.waves}, {plan.block_n}, {plan.num_warps}, {plan.num_stages}{mark} | {us:.1f} | "
                  f"{100 * nbytes / (us * 1e-6) / bw:.0f}% | {base / us if base else float('nan'):.2f}× |", flush=True)


if __name__ == "__main__":
    main()
