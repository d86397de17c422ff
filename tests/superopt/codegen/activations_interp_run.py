"""Search small norm / activation programs and run their fused μGraphs in Triton's CPU interpreter.

Run as ``python -m tests.superopt.codegen.activations_interp_run`` (TRITON_INTERPRET must be set
before triton is imported). Prints one JSON line: case -> [kernels, relative error vs float64].
"""
from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from superopt.interp import NumpyDomain, evaluate  # noqa: E402
from superopt.lax import Program  # noqa: E402
from superopt.runtime import compile_graph  # noqa: E402
from superopt.search import SearchBudget, superoptimize  # noqa: E402

ROWS, HID, OUT = 3, 40, 24
BUDGET = SearchBudget(max_seconds=120, max_states=40_000, grid_dims=1, workers=1)


def program(case: str, dtype: str = "float32"):
    p = Program(case)
    x = p.input("x", (ROWS, HID), dtype)
    w = p.input("w", (HID, OUT), dtype)
    bias = p.input("bias", (OUT,), dtype)
    if case.startswith("ln_"):
        g, b = p.input("g", (HID,), dtype), p.input("b", (HID,), dtype)
        h = p.matmul(p.layer_norm(x, g, b), w)
        act = case[3:]
    else:
        h, act = p.matmul(x, w), case
    p.output(p.activation(act, p.add(h, bias)))
    return p.build()


CASES = ("gelu", "gelu_pytorch_tanh", "relu", "relu2", "quick_gelu", "tanh", "ln_gelu")


def run(case: str) -> tuple[int, float]:
    prog = program(case)
    r = superoptimize(prog, BUDGET)
    fused = min((g for g, _ in r.ranked), key=lambda g: g.num_kernels)
    rng = np.random.default_rng(0)
    xs = [torch.from_numpy(rng.standard_normal(v.type.shape)).to(torch.float32) for v in prog.inputs]
    (ref,) = evaluate(prog, [x.double().numpy() for x in xs], NumpyDomain())
    cg = compile_graph(fused, device="cpu")
    for buf in cg.pool.values():
        if buf.dim():
            buf.fill_(float("nan"))
    (out,) = [o.clone() for o in cg(*xs)]
    return fused.num_kernels, float(np.linalg.norm(out.double().numpy() - ref) / np.linalg.norm(ref))


if __name__ == "__main__":
    print(json.dumps({c: run(c) for c in CASES}))
