"""What a kernel that only reads decode attention's bytes achieves at the same size and grid.

    python benchmarks/probe_attention_floor.py [--row "Llama-3-8B attn 4k b1"] [--ncu]

Decode attention at 4k tokens, b1, moves 16.8 MB: a few microseconds at HBM rate, so a kernel's
fixed costs (launch, the first bytes' latency, the last wave's tail) are a large share of it. This
prints, graph-replayed over inputs rotated beyond L2 (as bench_blocks times): a device-to-device
copy of the same bytes, a Triton kernel that reads K and V as the split kernel does (one block per
(kv head, split), its tokens in one load or a loop) and only sums them, and the row's μGraph
candidates — the ceiling a kernel of this size can reach next to what ours reaches. ``--ncu``: one
call of each, nothing timed, for ``ncu -k regex:...`` to profile.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from benchmarks.bench_blocks import candidates, llama_rows, make_inputs
from superopt.runtime import compile_graph
from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call


@triton.jit
def read_split(k_ptr, v_ptr, out_ptr, TOKENS: tl.constexpr, D: tl.constexpr, STEP: tl.constexpr):
    """Block (head, split) reads TOKENS rows of D from K and V, STEP rows per load, and stores a sum."""
    base = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * TOKENS * D
    acc = tl.zeros([STEP, D], tl.float32)
    for i in range(0, TOKENS, STEP):
        offs = base + (i + tl.arange(0, STEP))[:, None] * D + tl.arange(0, D)[None, :]
        acc += tl.load(k_ptr + offs).to(tl.float32) + tl.load(v_ptr + offs).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.sum(acc))


def readers(keys: torch.Tensor, splits: int, warps: int, step: int):
    b, h, n, d = keys.shape
    out = torch.empty(b * h * splits, device=keys.device, dtype=torch.float32)

    def call(k, v):
        read_split[(b * h, splits)](k, v, out, TOKENS=n // splits, D=d, STEP=step, num_warps=warps)
    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", default="Llama-3-8B attn 4k b1")
    ap.add_argument("--ncu", action="store_true", help="one call of each, for ncu")
    args = ap.parse_args()
    (label, name, kw, dt), = [r for r in llama_rows() if r[0] == args.row]
    fx, cands = candidates(name, kw, dt)
    xs = make_inputs(fx, dt, name)
    keys, values = xs[1], xs[2]
    nbytes = sum(x.numel() * x.element_size() for x in xs)
    plans = [(s, w, st) for s in (32, 64) for w in (4, 8) for st in (keys.shape[2] // s, 32)
             if st <= keys.shape[2] // s]
    if args.ncu:
        for s, w, st in plans:
            readers(keys, s, w, st)(keys, values)
        for g in cands[:4]:
            compile_graph(g)(*xs)
        torch.cuda.synchronize()
        return
    bw = copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s; {label}: "
          f"{nbytes / 1e6:.1f} MB, floor {nbytes / bw * 1e6:.2f} µs\n")
    print("| kernel | graph µs | % copy BW |\n|---|---|---|")

    def row(what: str, fn, ins) -> None:
        us = time_call(fn, rotated_sets(ins), graph=True)
        print(f"| {what} | {us:.2f} | {100 * nbytes / (us * 1e-6) / bw:.0f}% |", flush=True)

    half = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    row("copy of half the bytes (read + write = the row's bytes)", lambda a, b: b.copy_(a),
        [half, torch.empty_like(half)])
    for s, w, st in plans:
        row(f"read K and V only: {keys.shape[1]}x{s} blocks, {w} warps, {st} tokens a load",
            readers(keys, s, w, st), [keys, values])
    for g in cands[:4]:
        blk = g.customized_nodes()[0].block
        row(f"μGraph grid {'x'.join(map(str, blk.grid))} f{blk.forloop}", compile_graph(g), xs)


if __name__ == "__main__":
    main()
