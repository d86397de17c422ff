"""Search the LayerNorm / Gemma-norm / activation blocks of issue 27 and print their table rows.

    python benchmarks/run_norm_suite.py                    # every row, b1
    python benchmarks/run_norm_suite.py --only neox --batch 1 8

Rows (float16 like ``run_search_suite.py``; shapes from the models' configs): Gemma-2-2B's
pre-feedforward RMSNorm (1 + w) → gate / up → GELU-tanh · up, and its down projection →
post-feedforward RMSNorm (1 + w) → residual; GPT-NeoX (Pythia-1.4B) and StarCoder2-3B LayerNorm(w, b)
→ qkv projection (+ bias) and LayerNorm(w, b) → up projection + bias → GELU (erf for NeoX, tanh for
StarCoder2). Prints markdown rows in ``search_results.md``'s format.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from run_search_suite import run_row  # noqa: E402  (benchmarks/ is the script's directory)

from superopt.lax import Program
from superopt.search import SearchBudget

DT = "float16"


def gemma_mlp_up(rows, hidden, inter, name):
    p = Program(name)
    x = p.input("x", (rows, hidden), DT)
    g = p.input("pre_norm", (hidden,), DT)
    wg = p.input("w_gate", (hidden, inter), DT)
    wu = p.input("w_up", (hidden, inter), DT)
    h = p.rms_norm(x, p.add(g, p.const(1.0, DT)), 1e-6)
    p.output(p.mul(p.gelu_tanh(p.matmul(h, wg)), p.matmul(h, wu)))
    return p.build()


def gemma_mlp_up_hf(rows, hidden, inter, name):
    """As HF's Gemma2 computes it in bf16: the norm in fp32 (x.float(), 1 + w.float()), cast back."""
    p = Program(name)
    x = p.input("x", (rows, hidden), "bfloat16")
    g = p.input("pre_norm", (hidden,), "bfloat16")
    wg = p.input("w_gate", (hidden, inter), "bfloat16")
    wu = p.input("w_up", (hidden, inter), "bfloat16")
    h = p.cast(p.rms_norm(p.cast(x, "float32"), p.add(p.cast(g, "float32"), p.const(1.0, "float32")), 1e-6),
               "bfloat16")
    p.output(p.mul(p.gelu_tanh(p.matmul(h, wg)), p.matmul(h, wu)))
    return p.build()


def gemma_mlp_down(rows, hidden, inter, name):
    p = Program(name)
    a = p.input("a", (rows, inter), DT)
    wd = p.input("w_down", (inter, hidden), DT)
    g = p.input("post_norm", (hidden,), DT)
    r = p.input("residual", (rows, hidden), DT)
    p.output(p.add(r, p.rms_norm(p.matmul(a, wd), p.add(g, p.const(1.0, DT)), 1e-6)))
    return p.build()


def ln_matmul(rows, hidden, out, bias, name):
    p = Program(name)
    x = p.input("x", (rows, hidden), DT)
    g, b = p.input("ln_w", (hidden,), DT), p.input("ln_b", (hidden,), DT)
    w = p.input("w", (hidden, out), DT)
    y = p.matmul(p.layer_norm(x, g, b, 1e-5), w)
    p.output(p.add(y, p.input("bias", (out,), DT)) if bias else y)
    return p.build()


def ln_matmul_bias_gelu(rows, hidden, out, act, name):
    p = Program(name)
    x = p.input("x", (rows, hidden), DT)
    g, b = p.input("ln_w", (hidden,), DT), p.input("ln_b", (hidden,), DT)
    w = p.input("w", (hidden, out), DT)
    bias = p.input("bias", (out,), DT)
    p.output(p.activation(act, p.add(p.matmul(p.layer_norm(x, g, b, 1e-5), w), bias)))
    return p.build()


def rows(batches):
    out = []
    for b in batches:
        out += [
            (f"gemma2_2b norm+gelu_tanh mlp_up b{b}", lambda b=b: gemma_mlp_up(b, 2304, 9216, f"gemma2_up_b{b}")),
            (f"gemma2_2b bf16, fp32 norm (HF) + gelu_tanh mlp_up b{b}",
             lambda b=b: gemma_mlp_up_hf(b, 2304, 9216, f"gemma2_up_hf_b{b}")),
            (f"gemma2_2b mlp_down+post-norm+residual b{b}",
             lambda b=b: gemma_mlp_down(b, 2304, 9216, f"gemma2_down_b{b}")),
            (f"neox_1.4b LN(w,b)->qkv+bias b{b}", lambda b=b: ln_matmul(b, 2048, 6144, True, f"neox_qkv_b{b}")),
            (f"neox_1.4b LN->up+bias->gelu b{b}",
             lambda b=b: ln_matmul_bias_gelu(b, 2048, 8192, "gelu", f"neox_up_b{b}")),
            (f"starcoder2_3b LN(w,b)->qkv b{b}", lambda b=b: ln_matmul(b, 3072, 3584, False, f"sc2_qkv_b{b}")),
            (f"starcoder2_3b LN->up+bias->gelu_tanh b{b}",
             lambda b=b: ln_matmul_bias_gelu(b, 3072, 12288, "gelu_pytorch_tanh", f"sc2_up_b{b}")),
        ]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--batch", nargs="*", type=int, default=[1])
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--max-states", type=int, default=400_000)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    budget = SearchBudget(max_seconds=args.max_seconds, max_states=args.max_states, workers=args.workers)
    print(f"budget {budget.log()}; {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for name, build in rows(args.batch):
        if args.only and not any(w.lower() in name.lower() for w in args.only):
            continue
        r = run_row(name, build, budget, 0)
        print(f"| {r['name']} | {r['fewest']} (1) | {r['kernels']} | {r['states']:,} | {r['pruned']:,} | "
              f"{r['prune_rate']:.2f} | {r['patterns']} | {r['verified']} / {r['rejected']} | {r['full']} | "
              f"{r['search']:.1f} | {r['wall']:.1f} | {r['cost']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
