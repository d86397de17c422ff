"""Probe: the fastest a decode step of K launches a token can be, measured (issue 29's ceiling).

A decode step of a small model is a chain of hundreds of dependent kernels, each reading ~1–30 MB.
This replays, in one CUDA graph, a chain of *ideal* kernels with exactly a design's launches and the
bytes each of them reads: every kernel a plain stream over its own slice of one buffer far larger
than L2 (the best of a few grids for its size, measured first), no math, no writes but one float a
program. Whatever a real kernel adds (a GEMV's x and outputs, an attention's latency, a norm's
reduction) only makes it slower, so the chain's time is a lower bound for that design, and
floor ÷ chain time is the highest % of the floor the design can reach on this GPU.

Designs, per decoder layer (the bytes from the registry's config; KV cache at ``--context`` tokens):
- ``7/layer``: the launches patch() builds today: q (+norm), k+v (paired), split attention over
  the cache, its combine, o_proj (+residual), gate+up (+norm), down (+residual);
- ``5/layer``: q, k and v in one launch, and the combine inside o_proj;
- ``1/layer``: one launch reading the whole layer (a persistent kernel per layer);
plus lm_head and one small kernel (the token choice) a step, each with and without programmatic
dependent launch (PDL, as the generated kernels use it on sm_90). ``1/step`` is one launch reading
everything: the stream's own ceiling. It passes 100%: the floor is the bench's, bytes ÷ the copy
bandwidth (read and write), and a pure read stream runs a few % faster than a copy.

    python benchmarks/probe_launch_chain.py [--models Qwen2.5-0.5B,Qwen3-0.6B,Llama-3.2-1B,Llama-3.1-8B]
        [--context 256] [--batch 1]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from superopt.runtime.grid_dependency import launch_options
from superopt.runtime.timing import copy_bandwidth, time_call

BLOCK = 4096  # bf16 elements one program loads per loop iteration (8 KB)
PER_PROGRAM = (BLOCK, 2 * BLOCK, 4 * BLOCK, 8 * BLOCK, 16 * BLOCK, 32 * BLOCK)  # the grids tried


@triton.jit
def _tile(src, start, j: tl.constexpr, n, BLOCK: tl.constexpr):
    offs = start + j * BLOCK + tl.arange(0, BLOCK)
    return tl.load(src + offs, mask=offs < n, other=0.0).to(tl.float32)


@triton.jit
def _stream(src, out, n, PER_PROG: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, PRE: tl.constexpr = 0):
    """Sum a program's PER_PROG elements; PRE (0, 1, 2, 4 or 8): its first PRE tiles are loaded before the wait
    for the kernel before it and held in registers until after it, as a kernel may load the weights no launch
    writes (a GEMV's, before its input is ready)."""
    start = tl.program_id(0).to(tl.int64) * PER_PROG  # a 1/step stream of an 8B model passes 2**31 elements
    if PRE >= 1:
        t0 = _tile(src, start, 0, n, BLOCK)
    if PRE >= 2:
        t1 = _tile(src, start, 1, n, BLOCK)
    if PRE >= 4:
        t2 = _tile(src, start, 2, n, BLOCK)
        t3 = _tile(src, start, 3, n, BLOCK)
    if PRE >= 8:
        t4 = _tile(src, start, 4, n, BLOCK)
        t5 = _tile(src, start, 5, n, BLOCK)
        t6 = _tile(src, start, 6, n, BLOCK)
        t7 = _tile(src, start, 7, n, BLOCK)
    if PDL:  # as every generated kernel starts (superopt.runtime.grid_dependency)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK], tl.float32)
    if PRE >= 1:
        acc += t0
    if PRE >= 2:
        acc += t1
    if PRE >= 4:
        acc += t2 + t3
    if PRE >= 8:
        acc += t4 + t5 + t6 + t7
    for i in range(PRE * BLOCK, PER_PROG, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out + tl.program_id(0), tl.sum(acc))


def design_bytes(cfg: dict, design: str, context: int, batch: int) -> list[int]:
    """Bytes each launch of one decode step reads (bf16), in order, for ``design``."""
    from mirage_serve.registry import head_dim

    h, inter, layers, vocab = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "vocab_size"))
    hd = head_dim(cfg)
    q = cfg["num_attention_heads"] * hd
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    cache = 2 * kv * context * batch  # k and v rows the attention reads
    layer = {"7/layer": [h * q, 2 * h * kv, cache, 0, q * h, 2 * h * inter, inter * h],
             "5/layer": [h * (q + 2 * kv), cache, q * h, 2 * h * inter, inter * h],
             "1/layer": [h * (q + 2 * kv) + cache + q * h + 3 * h * inter]}
    if design == "1/step":
        return [2 * (layers * sum(layer["1/layer"]) + vocab * h)]
    return [2 * e for e in layer[design] * layers + [vocab * h, 0]]


class Chain:
    """The launches of one design over consecutive slices of ``buf``, each with its grid."""

    def __init__(self, buf: torch.Tensor, sizes: list[int], per_program: dict[int, int], pdl: bool, pre: int = 0):
        self.calls, at = [], 0
        self.out = torch.empty(1 << 16, device=buf.device, dtype=torch.float32)
        for nbytes in sizes:
            n = nbytes // 2
            per = per_program.get(nbytes, BLOCK)
            # a program preloads at most its own tiles (both powers of two: one of _stream's PRE)
            self.calls.append((buf[at:at + max(n, 1)], n, per, (max(1, triton.cdiv(n, per)),),
                               min(pre, per // BLOCK)))
            at += n
        self.pdl = pdl

    def __call__(self) -> None:
        for src, n, per, grid, pre in self.calls:
            _stream[grid](src, self.out, n, PER_PROG=per, BLOCK=BLOCK, PDL=self.pdl, PRE=pre, num_warps=8,
                          **launch_options(self.pdl))


def graph_us(fn) -> float:
    """Median µs of one replay of a CUDA graph of ``fn()`` (``superopt.runtime.timing.time_call``)."""
    return time_call(fn, [[]], graph=True, reps=20)


def best_grids(buf: torch.Tensor, sizes: set[int], pdl: bool, copies: int = 24, pre: int = 0) -> dict[int, int]:
    """Per size, the elements a program reads that make a chain of ``copies`` such kernels fastest (each program
    preloading up to ``pre`` tiles)."""
    best = {}
    for nbytes in sorted(sizes):
        if nbytes == 0:
            continue
        k = max(1, min(copies, buf.numel() * 2 // nbytes))
        times = {per: graph_us(Chain(buf, [nbytes] * k, {nbytes: per}, pdl, pre)) for per in PER_PROGRAM
                 if triton.cdiv(nbytes // 2, per) <= 65535}
        best[nbytes] = min(times, key=times.get)
    return best


def main(argv=None) -> None:
    from mirage_serve import registry

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen2.5-0.5B,Qwen3-0.6B,Llama-3.2-1B,Llama-3.1-8B")
    ap.add_argument("--context", type=int, default=256, help="KV-cache tokens the attention reads")
    ap.add_argument("--batch", type=int, default=1, help="rows: only the KV-cache bytes scale with it")
    ap.add_argument("--preload", default="0", help="comma-separated tiles (8 KB) each program loads before its "
                                                   "dependent-launch wait (0, 1, 2, 4, 8), each a row with PDL on")
    ap.add_argument("--designs", default="7/layer,5/layer,1/layer,1/step")
    args = ap.parse_args(argv)
    preloads = [int(p) for p in args.preload.split(",")]
    if any(p not in (0, 1, 2, 4, 8) for p in preloads):
        raise SystemExit(f"--preload: each of 0, 1, 2, 4, 8 (tiles a program preloads), got {args.preload!r}")
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}; copy "
          f"{bw / 1e12:.2f} TB/s; context {args.context}, batch {args.batch}; ideal stream kernels in one CUDA "
          f"graph, best grid per size\n")
    print("| model | design | launches/token | PDL | preload tiles | chain µs | floor µs "
          "| µs a launch above the floor | ceiling % of floor |\n|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        cfg = dict(registry.get(name).config)
        designs = {d: design_bytes(cfg, d, args.context, args.batch) for d in args.designs.split(",")}
        total = max(sum(s) for s in designs.values())
        buf = torch.empty(total // 2 + 1, device="cuda", dtype=torch.bfloat16).normal_()
        floor_us = registry.decode_bytes(cfg) / bw * 1e6  # the bench's floor: weights only
        runs = [(False, 0)] * (0 in preloads) + [(True, p) for p in preloads]  # preloading needs the wait
        for pdl, pre in runs:
            grids = best_grids(buf, {s for sizes in designs.values() for s in sizes}, pdl, pre=pre)
            for design, sizes in designs.items():
                us = graph_us(Chain(buf, sizes, grids, pdl, pre))
                above = (us - sum(sizes) / bw * 1e6) / len(sizes)
                print(f"| {name} | {design} | {len(sizes)} | {'on' if pdl else 'off'} | {pre} | {us:.1f} "
                      f"| {floor_us:.1f} | {above:.2f} | {100 * floor_us / us:.1f}% |", flush=True)
        del buf
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
