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
from superopt.runtime import compile_graph  # noqa: E402
from tests.superopt.codegen.activation_cases import CASES, fused_graph, program  # noqa: E402


def run(case: str) -> tuple[int, float]:
    prog = program(case)
    fused = fused_graph(prog)
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
