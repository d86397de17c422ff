"""Does the decode attention lose its early cache loads behind a kernel that fills the GPU? (issue 29)

    python benchmarks/probe_attention_behind.py --models Qwen2.5-0.5B,Llama-3.2-1B,Qwen3-0.6B \
        --kv-len 512 --position 256 --blocks 132,528,2112 --ballast-mb 12

Session 39's H200 traces (benchmarks/results/floor_h200_2026-11-28_s39/README.md, section 3) put the attention's
end 2.4 µs after the q/k/v kernel's at 2 kv heads and 5.0-5.5 µs at 8. Alone, the two shapes take the same time.
The hypothesis: at 8 kv heads the split has four times the programs (64 against 16), and while the q/k/v kernel's
blocks fill the SMs they cannot become resident early. Their cache tiles, meant to load before the dependent-launch
wait (``attention_kernels._attend_split``, ONE_TILE), then load after it.

What is timed, each in a CUDA graph over inputs rotated beyond L2 (``superopt.runtime.timing.time_call``):
- **alone**: the hand-written split attention and its combine, at the model's heads (``--batch`` rows);
- **ballast N**: a stream of ``--ballast-mb`` MB of its own, in a grid of N blocks. With dependent launch, it waits
  for its predecessor and then lets its successor start, as the generated kernels do
  (``superopt.runtime.grid_dependency``);
- **behind N**: the ballast, then the attention.

The table's "after" is behind N minus ballast N: what the attention adds to a step behind such a kernel. "after" well
above "alone" at 8 kv heads and not at 2, and growing with N, supports the hypothesis.

Session 40's answer, on an H200 (benchmarks/results/floor_h200_2026-11-28_s40/README.md, section 2): it does not.
Behind 528 or 2112 blocks, "after" is about 5 µs at 2 kv heads as at 8 (alone: 3.1-4.3 µs); only the one-block-a-SM
ballast leaves the 2-kv-head shape at its alone cost.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.probe_launch_chain import _stream
from benchmarks.profile_attention import handwritten
from benchmarks.sweep_attention import model_rows
from superopt.runtime.grid_dependency import applies, launch_options
from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call

BLOCK = 512  # elements a ballast program loads at a time (1 KB of bf16)


def ballast(blocks: int, mb: float, pdl: bool):
    """(call, inputs) of a stream of about ``mb`` MB of bf16 in ``blocks`` programs, each a whole number of BLOCKs:
    probe_launch_chain's stream kernel, which waits for its predecessor and signals its successor as the generated
    kernels do."""
    per = max(BLOCK, int(mb * 2**20 / 2 / blocks) // BLOCK * BLOCK)
    x = torch.randn(blocks * per, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(blocks, device="cuda", dtype=torch.float32)
    options = launch_options(pdl)

    def call(x):
        _stream[(blocks,)](x, out, x.numel(), PER_PROG=per, BLOCK=BLOCK, PDL=pdl, num_warps=4, **options)
    return call, [x]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen2.5-0.5B,Llama-3.2-1B,Qwen3-0.6B,Llama-3.1-8B")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-len", type=int, default=512, help="the cache's capacity (the bench's: 512)")
    ap.add_argument("--position", type=int, default=256, help="the new token's slot")
    ap.add_argument("--blocks", default="132,528,2112", help="comma-separated ballast grids")
    ap.add_argument("--ballast-mb", type=float, default=12.0)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    pdl = applies(dev)
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy {bw / 1e12:.2f} TB/s; dependent launch {'on' if pdl else 'OFF'}; "
          f"batch {args.batch}, cache {args.kv_len}, new token at {args.position}; ballast {args.ballast_mb} MB\n")
    print("| model | kv heads | head dim | alone µs | ballast blocks | ballast MB | ballast µs | behind µs | "
          "after µs (behind - ballast) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        (_, _, kw, _), = model_rows(name, [args.batch], args.kv_len, args.position)
        attend, axs = handwritten(kw, torch.bfloat16)
        alone = time_call(attend, rotated_sets(axs), graph=True)
        for blocks in (int(b) for b in args.blocks.split(",")):
            stream, bxs = ballast(blocks, args.ballast_mb, pdl)
            b_us = time_call(stream, rotated_sets(bxs), graph=True)
            n_b = len(bxs)

            def both(*xs):
                stream(*xs[:n_b])
                attend(*xs[n_b:])
            behind = time_call(both, rotated_sets(bxs + axs), graph=True)
            mb = sum(x.numel() * x.element_size() for x in bxs) / 1e6
            print(f"| {name} | {kw['kv_heads']} | {kw['head_dim']} | {alone:.1f} | {blocks} | {mb:.1f} | {b_us:.1f} | "
                  f"{behind:.1f} | {behind - b_us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
