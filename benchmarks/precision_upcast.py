"""Precision is a constraint: a bf16 RMSNorm → matmul with HF's fp32 upcast, searched with the
precision rule on and off; prints each winner's arithmetic dtypes and its measured error.

    PYTHONPATH=$PWD python benchmarks/precision_upcast.py                 # rows 8, hidden 2048, out 512
    PYTHONPATH=$PWD python benchmarks/precision_upcast.py --hidden 4096

The program is Llama's RMSNorm as HF writes it (``h = x.float()``; ``h * rsqrt(mean(h²) + eps)``;
``weight * h.to(bf16)``) feeding a projection. With ``keep_precision`` off the block search
computes the sum of squares and the rsqrt in bfloat16 (casts are value identities for the abstract
domain and the verifier, and the replay of the program's dataflow then matches values without their
dtype, taking the bf16 input for ``x.float()``); with it on (the default) such values are pruned ("precision") and the
dtype check ``superopt.verify.precision`` rejects any candidate that squares, divides or takes the
rsqrt narrower than the program (its verdict on each winner is printed). Errors are
relative Frobenius errors of the μGraph, executed as tiled by the torch Domain on CPU in its
declared dtypes, against the program in float64 on the same bf16-rounded inputs. Each op's result
is rounded to its dtype, but torch's CPU sum of a bf16 tile accumulates in float32 before rounding,
so the bf16 μGraph's error is a lower bound (only the per-tile ``accum_sum`` rounds in bf16).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import torch

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.torch_domain import TorchDomain
from superopt.search import SearchBudget, superoptimize
from superopt.verify.precision import precision_violations
from tests.fixtures.precision import hf_rmsnorm_matmul_bf16


def arithmetic_dtypes(graph) -> list[str]:
    """op:dtype of every arithmetic node inside the graph's kernels, in order."""
    out = []
    for n in graph.nodes:
        for b in ([n.block] if n.block is not None else []):
            out += [f"{m.op}:{m.out.type.dtype}" for m in b.nodes if m.op not in ("cast", "const")]
        if n.block is None and n.op not in ("cast", "const"):
            out.append(f"{n.op}:{n.out.type.dtype}")
    return out


def rel_error(program, graph, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    shapes = {v.name: v.type.shape for v in program.inputs}
    raw = {"x": rng.standard_normal(shapes["x"]) * 3 + 1, "g": rng.standard_normal(shapes["g"]) * 0.1 + 1,
           "w": rng.standard_normal(shapes["w"]) * 0.02}
    tin = {k: torch.tensor(v, dtype=torch.bfloat16) for k, v in raw.items()}
    (ref,) = evaluate(program, {k: v.double().numpy() for k, v in tin.items()}, NumpyDomain())
    (got,) = evaluate(graph, tin, TorchDomain())
    got = got.double().numpy()
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--out", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    prog = hf_rmsnorm_matmul_bf16(a.rows, a.hidden, a.out)
    print(f"program: bf16 RMSNorm (fp32 upcast) -> matmul, rows {a.rows}, hidden {a.hidden}, out {a.out}")
    print(f"  unfused program, torch bf16/fp32 as written: rel err {rel_error(prog, prog):.3e}")
    for keep in (True, False):
        budget = replace(SearchBudget(max_seconds=120, workers=a.workers), keep_precision=keep)
        t0 = time.perf_counter()
        r = superoptimize(prog, budget)
        dt = time.perf_counter() - t0
        bf16_arith = [d for d in arithmetic_dtypes(r.best) if d.endswith("bfloat16") and not d.startswith("matmul")]
        print(f"keep_precision={keep}: {r.best.num_kernels} kernel(s), search {dt:.1f} s, "
              f"pruned for precision {r.stats.pruned.get('precision', 0)}")
        print(f"  winner's arithmetic: {' '.join(arithmetic_dtypes(r.best))}")
        print(f"  bf16 arithmetic besides the matmul: {bf16_arith or 'none'}")
        print(f"  measured rel err vs float64: {rel_error(prog, r.best):.3e}")
        print(f"  dtype check (verify.precision) on it: {'; '.join(precision_violations(prog, r.best)) or 'passes'}")


if __name__ == "__main__":
    main()
