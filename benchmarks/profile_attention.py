"""Where decode attention's time goes: each kernel of the μGraph candidates and of the hand-written
flash-decoding kernels that ``patch()`` runs, at bench_blocks' attention shapes.

    python benchmarks/profile_attention.py [--only "Llama-3-8B attn 4k b1,Qwen2.5-0.5B attn 4k b1"]

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

from benchmarks.bench_blocks import candidates, llama_rows, make_inputs
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
    last slot and attention over the whole cache, no mask; ``plan``: a ``LaunchPlan`` (None: the
    default)."""
    from mirage_serve.decode.attention_launch import DEFAULT_PLAN, decode_attention

    b, hq, hkv, d, n = kw["batch"], kw["q_heads"], kw["kv_heads"], kw["head_dim"], kw["kv_len"]
    dev = "cuda"
    xs = [torch.randn(b, hq * d, device=dev, dtype=dtype), torch.randn(b, hkv * d, device=dev, dtype=dtype),
          torch.randn(b, hkv * d, device=dev, dtype=dtype), torch.randn(1, d, device=dev, dtype=dtype),
          torch.randn(1, d, device=dev, dtype=dtype), torch.randn(b, hkv, n, d, device=dev, dtype=dtype),
          torch.randn(b, hkv, n, d, device=dev, dtype=dtype)]
    pos = torch.tensor(n - 1, device=dev)
    scale = 1 / math.sqrt(d)

    def call(q, k, v, cos, sin, keys, values):
        return decode_attention(q, k, v, cos, sin, keys, values, pos, None, scale, plan=plan or DEFAULT_PLAN)
    return call, xs


def attention_rows(only: str):
    """bench_blocks' decode-attention rows (label, name, kw, dtype) whose label holds one of the
    comma-separated substrings ``only``."""
    for label, name, kw, dt in llama_rows():
        if name == "decode_attention" and any(s in label for s in only.split(",")):
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
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s\n")
    print("| row | kernels | graph µs | % copy BW | floor µs | device µs per kernel (profiler) |")
    print("|---|---|---|---|---|---|")
    for label, name, kw, dt in attention_rows(args.only):
        fx, cands = candidates(name, kw, dt)
        xs = make_inputs(fx, dt, name)
        for g in cands[:args.max_candidates]:
            blk = g.customized_nodes()[0].block
            try:
                report(label, f"μGraph grid {'x'.join(map(str, blk.grid))} f{blk.forloop}",
                       compile_graph(g), xs, bw)
            except Exception as e:  # one failing candidate must not hide the others
                print(f"| {label} | grid {blk.grid}: {type(e).__name__}: {str(e)[:120]} |", flush=True)
        fn, hxs = handwritten(kw, getattr(torch, dt))
        report(label, "hand-written (patch)", fn, hxs, bw)


if __name__ == "__main__":
    main()
