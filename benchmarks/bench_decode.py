"""End-to-end decode benchmark (docs/measuring.md, issue "decode fast path") over several models.

One `mirage-serve bench` per model, in one process each after the other: HF eager, HF static
cache + auto torch.compile, and ours (patch(): fused kernels + owned static KV cache + CUDA-graph
decode steps), each in ms/step with the bandwidth floor from a copy measured in the same run,
and greedy tokens compared with eager. Tables are appended to --markdown.

    python benchmarks/bench_decode.py --models Llama-3.1-8B,Qwen2.5-0.5B,Qwen3-8B --batch 1,8 \\
        --markdown benchmarks/results/decode_<device>_<date>.md
"""
from __future__ import annotations

import argparse
import sys

from mirage_serve.cli import main as cli_main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Llama-3.1-8B,Qwen2.5-0.5B,Qwen3-8B")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--new-tokens", default="256")
    ap.add_argument("--repeats", default="3")
    ap.add_argument("--baselines", default="eager,static-compile")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--json-dir", default=None, help="write <model>.json records here")
    args, passthrough = ap.parse_known_args(argv)
    worst = 0
    for model in args.models.split(","):
        cmd = ["bench", model, "--batch", args.batch, "--new-tokens", args.new_tokens,
               "--repeats", args.repeats, "--baselines", args.baselines, "--report", *passthrough]
        if args.markdown:
            cmd += ["--markdown", args.markdown]
        if args.json_dir:
            cmd += ["--json", f"{args.json_dir}/{model}.json"]
        print(f"$ mirage-serve {' '.join(cmd)}", flush=True)
        worst = max(worst, cli_main(cmd))
    return worst


if __name__ == "__main__":
    sys.exit(main())
