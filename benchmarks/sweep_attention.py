"""Launch plans of the hand-written decode-attention kernels, timed at bench_blocks' attention shapes.

    python benchmarks/sweep_attention.py [--only "attn 4k b1"]
    python benchmarks/sweep_attention.py --models Llama-3.2-1B,Qwen2.5-0.5B --kv-len 384 --position 256 --waves 1,2

For each shape: every ``LaunchPlan`` (waves of programs, cache positions per iteration, warps,
pipeline stages), one call replayed in a CUDA graph over inputs rotated beyond L2, as a share of the
copy bandwidth measured in the same run; the default plan is marked. The shapes are bench_blocks'
attention rows, or with ``--models`` the registry models' heads at a cache of ``--kv-len`` slots with
the new token at ``--position`` (the bench's decode: a static cache of prompt + new tokens, filled
half-way on average). What the split plan of ``attention_launch`` should be is read off this table,
not guessed.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.profile_attention import attention_rows, handwritten
from mirage_serve import registry
from mirage_serve.decode.attention_launch import DEFAULT_PLAN, LaunchPlan, split_plan
from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call


def model_rows(models: str, batches: list[int], kv_len: int, position: int | None):
    """(label, name, kw, dtype) rows of the registry models' attention heads at one cache shape."""
    for name in models.split(","):
        cfg = registry.get(name).config
        heads = cfg["num_attention_heads"]
        for b in batches:
            slot = kv_len - 1 if position is None else position
            kw = dict(batch=b, q_heads=heads, kv_heads=cfg.get("num_key_value_heads") or heads,
                      head_dim=registry.head_dim(cfg), kv_len=kv_len, position=slot)
            yield f"{name} L{kv_len} @{kw['position']} b{b}", "decode_attention", kw, "bfloat16"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="attn", help="comma-separated substrings of bench_blocks' row labels")
    ap.add_argument("--waves", default="1,2,4,8")
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--one-tile-splits", default="0,16", help="one tile a split up to so many splits (LaunchPlan)")
    ap.add_argument("--combine-warps", default="1", help="warps of a combine program (LaunchPlan)")
    ap.add_argument("--models", default="", help="comma-separated registry names (in place of bench_blocks' rows)")
    ap.add_argument("--batch", default="1,8", help="with --models")
    ap.add_argument("--kv-len", type=int, default=384, help="with --models: the cache's capacity")
    ap.add_argument("--position", type=int, default=None, help="with --models: the new token's slot (default: last)")
    ap.add_argument("--top", type=int, default=5, help="plans printed per shape (the default always)")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    plans = [LaunchPlan(*p) for p in itertools.product(ints(args.waves), ints(args.block_n), ints(args.warps),
                                                       ints(args.stages), ints(args.one_tile_splits),
                                                       ints(args.combine_warps))]
    bw = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s; {len(plans)} plans\n")
    print("| row | plan (waves, block_n, warps, stages, one_tile_splits, combine_warps) | splits | graph µs "
          "| % copy BW | vs default |")
    print("|---|---|---|---|---|---|")
    rows = (model_rows(args.models, ints(args.batch), args.kv_len, args.position) if args.models
            else attention_rows(args.only))
    for label, _, kw, dt in rows:
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
        shown = ranked[:args.top] + ([DEFAULT_PLAN] if DEFAULT_PLAN in timed and DEFAULT_PLAN not in ranked[:args.top]
                                     else [])  # (the default is not timed where the swept plans leave it out)
        for plan in shown:
            us = timed[plan]
            mark = " (default)" if plan == DEFAULT_PLAN else ""
            splits, _ = split_plan(kw["batch"], kw["kv_heads"], kw["kv_len"], sms, plan)
            print(f"| {label} | {plan.waves}, {plan.block_n}, {plan.num_warps}, {plan.num_stages}, "
                  f"{plan.one_tile_splits}, {plan.combine_warps}{mark} | {splits} | "
                  f"{us:.1f} | {100 * nbytes / (us * 1e-6) / bw:.0f}% | {base / us if base else float('nan'):.2f}× |",
                  flush=True)


if __name__ == "__main__":
    main()
