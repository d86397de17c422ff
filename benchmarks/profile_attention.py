"""Where decode attention's time goes: each kernel of the μGraph candidates and of the hand-written
flash-decoding kernels that ``patch()`` runs, at bench_blocks' attention shapes.

    python benchmarks/profile_attention.py [--only "Llama-3-8B attn 4k b1,Qwen2.5-0.5B attn 4k b1"]
    python benchmarks/profile_attention.py --suite paper --dtype float16 --only "GQA b1" --search-seconds 60

Per candidate: the time of one call replayed in a CUDA graph over inputs rotated beyond L2 (as
bench_blocks times it), its bytes as a share of the copy bandwidth measured in the same run, and
the device time of each kernel from torch.profiler (split kernel, combine kernel) — what a
missing bandwidth target is made of.
"""
from __future__ import annotations

import argparse
import math
from collections import defaultdict

import torch

from benchmarks.bench_blocks import ATTN, candidates, llama_rows, make_inputs, paper_rows, searched
from superopt.codegen.launch import Launch
from superopt.codegen.triton import render_triton
from superopt.runtime import compile_graph
from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call

REPS = 20


def kernel_us(fn, sets) -> dict[str, float]:
    """Mean device µs per call of each kernel ``fn`` launches (torch.profiler, eager calls)."""
    for s in sets:
        fn(*s)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            for s in sets:
                fn(*s)
        torch.cuda.synchronize()
    out = defaultdict(float)
    calls = REPS * len(sets)
    for e in prof.key_averages():
        if e.device_time_total > 0:
            out[e.key[:48]] += e.device_time_total / calls
    return dict(out)


def handwritten(kw: dict, dtype: torch.dtype, plan=None):
    """(call, inputs) of the decode path's kernels at the row's shape: RoPE, the cache write at the
    row's ``position`` (default: the last slot) and attention over the slots before it, no mask; ``plan``: a
    ``LaunchPlan`` (None: the default)."""
    from mirage_serve.decode.attention_launch import DEFAULT_PLAN, decode_attention

    b, hq, hkv, d, n = kw["batch"], kw["q_heads"], kw["kv_heads"], kw["head_dim"], kw["kv_len"]
    slot = kw.get("position", n - 1)  # the new token's slot: the last, unless the row says
    dev = "cuda"
    xs = [torch.randn(b, hq * d, device=dev, dtype=dtype), torch.randn(b, hkv * d, device=dev, dtype=dtype),
          torch.randn(b, hkv * d, device=dev, dtype=dtype), torch.randn(1, d, device=dev, dtype=dtype),
          torch.randn(1, d, device=dev, dtype=dtype), torch.randn(b, hkv, n, d, device=dev, dtype=dtype),
          torch.randn(b, hkv, n, d, device=dev, dtype=dtype)]
    pos = torch.tensor(slot, device=dev)
    scale = 1 / math.sqrt(d)

    def call(q, k, v, cos, sin, keys, values):
        return decode_attention(q, k, v, cos, sin, keys, values, pos, None, scale, plan=plan or DEFAULT_PLAN)
    return call, xs


def attention_rows(only: str, suite: str = "llama", dtype: str = "bfloat16"):
    """bench_blocks' attention rows (label, name, kw, dtype) of ``suite`` (llama: decode attention;
    paper: GQA, QKNorm in ``dtype``) whose label holds one of the comma-separated substrings ``only``."""
    rows = llama_rows() if suite == "llama" else paper_rows(dtype)
    for label, name, kw, dt in rows:
        if name in ATTN and any(s in label for s in only.split(",")):
            yield label, name, kw, dt


def report(label: str, name: str, fn, xs, bw: float) -> None:
    sets = rotated_sets(xs)
    us = time_call(fn, sets, graph=True)
    nbytes = sum(x.numel() * x.element_size() for x in xs)
    kernels = kernel_us(fn, sets)
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]))
    print(f"| {label} | {name} | {us:.1f} | {100 * nbytes / (us * 1e-6) / bw:.0f}% | "
          f"{nbytes / bw * 1e6:.1f} | {parts} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="attn", help="comma-separated substrings of bench_blocks' row labels")
    ap.add_argument("--max-candidates", type=int, default=6)
    ap.add_argument("--suite", choices=("llama", "paper"), default="llama")
    ap.add_argument("--dtype", default="bfloat16", help="the paper suite's")
    ap.add_argument("--search-seconds", type=float, default=0.0, help="also the search's μGraphs, first")
    ap.add_argument("--launch", default="", help="num_warps,num_stages for every kernel (default: the renderer's)")
    args = ap.parse_args()
    launch = Launch.of([int(v) for v in args.launch.split(",")]) if args.launch else None
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s\n")
    print("| row | kernels | graph µs | % copy BW | floor µs | device µs per kernel (profiler) |")
    print("|---|---|---|---|---|---|")
    for label, name, kw, dt in attention_rows(args.only, args.suite, args.dtype):
        fx, cands = candidates(name, kw, dt, searched(name, kw, dt, args.search_seconds)[0])
        xs = make_inputs(fx, dt, name)
        for g in cands[:args.max_candidates]:
            blk = g.customized_nodes()[0].block
            try:
                cg = compile_graph(g, launch={k.name: launch for k in render_triton(g).kernels} if launch else None)
                report(label, f"μGraph grid {'x'.join(map(str, blk.grid))} f{blk.forloop}", cg, xs, bw)
            except Exception as e:  # one failing candidate must not hide the others
                print(f"| {label} | grid {blk.grid}: {type(e).__name__}: {str(e)[:120]} |", flush=True)
        if name == "decode_attention":
            fn, hxs = handwritten(kw, getattr(torch, dt))
            report(label, "hand-written (patch)", fn, hxs, bw)


if __name__ == "__main__":
    main()
