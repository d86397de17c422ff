"""Two layers of (RMSNorm + GEMV split over K, GEMV + residual) as one persistent launch, in Triton's interpreter.

Run as ``python -m tests.superopt.runtime.persistent_interp_run DTYPE PROGRAMS`` in its own process
(TRITON_INTERPRET must be set before triton is imported). Both layers call one compiled RMSNorm + GEMV graph, as
``patch()`` shares a program between layers, so the second layer overwrites the first's output and split-K
workspace while the first layer's GEMV + residual reads them: the persistent launch must order that write after
that read. The calls are collected as a decode step's would be (``compiled.recording``). Prints one JSON line:
whether the recording has every call, the persistent run against the graphs called one by one (bit for bit) and
against float64, its launches, tasks and waits.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from superopt.runtime import compile_graph  # noqa: E402
from superopt.runtime.compiled import recording  # noqa: E402
from superopt.runtime.persistent import PersistentRun  # noqa: E402
from tests.fixtures.ugraphs import FIXTURES  # noqa: E402

ROWS, HIDDEN, FFN = 3, 90, 70  # odd: masked, padded tiles


def reference(h: torch.Tensor, layers) -> np.ndarray:
    """float64: per layer, h = (rmsnorm(h) @ w_in) @ w_out^T + h."""
    h = h.double().numpy()
    for w_in, w_out in layers:
        y = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-6) @ w_in.double().numpy()
        h = y @ w_out.double().numpy().T + h
    return h


def main(dtype: str, programs: int, tasks_per_launch: int | None = None) -> dict:
    t = getattr(torch, dtype)
    norm_graph = FIXTURES["rmsnorm_matmul"](rows=ROWS, hidden=HIDDEN, out=FFN, split_k=3, dtype=dtype).ugraph
    norm_in = compile_graph(norm_graph, device="cpu")
    out_graph = FIXTURES["matmul_residual"](rows=ROWS, hidden=FFN, out=HIDDEN, dtype=dtype).ugraph
    outs = [compile_graph(out_graph, device="cpu") for _ in range(2)]  # one body, two output buffers
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(ROWS, HIDDEN, generator=g).to(t)
    layers = [((torch.randn(HIDDEN, FFN, generator=g) / HIDDEN ** 0.5).to(t),
               (torch.randn(HIDDEN, FFN, generator=g) / FFN ** 0.5).to(t)) for _ in range(2)]

    y = norm_in.pool[norm_in.graph.outputs[0]]
    hs = [h0] + [o.pool[o.graph.outputs[0]] for o in outs]
    calls = []
    for i, (w_in, w_out) in enumerate(layers):
        calls += [(norm_in, [hs[i], w_in]), (outs[i], [y, w_out, hs[i]])]

    with recording() as recorded:  # one by one: layer 1 through a bound call (weights fixed), as patch() calls
        norm_in.bind([None, layers[0][0]])(h0)
        for cg, inputs in calls[1:]:
            cg(*inputs)
    one_by_one = hs[-1].clone()
    same = [(a is c and all(x is y for x, y in zip(i, j))) for (a, i), (c, j) in zip(recorded, calls)]
    run = PersistentRun(recorded, programs=programs, tasks_per_launch=tasks_per_launch)
    for buf in [y, *hs[1:]]:
        buf.fill_(float("nan"))
    got = run()[-1][0].clone()
    counters_reset = not (run._done.any() or run._ticket.any())
    for buf in [y, *hs[1:]]:
        buf.fill_(float("nan"))
    again = counters_reset and torch.equal(run()[-1][0], got)
    ref = reference(h0, layers)
    err = float(np.linalg.norm(got.double().numpy() - ref) / np.linalg.norm(ref))
    return {"recorded": len(recorded) == len(calls) and all(same),
            "equal": bool(torch.equal(got, one_by_one)), "again": bool(again), "rel_err": err, "launches": run.launches,
            "tasks": run.tasks, "bodies": len(run.bodies), "waits": run.dependencies, "weights": run.weights}


def chained(dtype: str) -> dict:
    """A graph whose split kernel runs its combine in its last blocks (``ir.chain``): the persistent launch runs
    the combine as a launch of its own, after the split one."""
    from superopt.codegen.launch import Launch
    from superopt.codegen.triton import render_triton
    from superopt.interp import NumpyDomain, evaluate
    from tests.superopt.codegen.triton_cases import build

    fx = build("decode_attention_odd", dtype)
    launch = {k.name: Launch(k.num_warps, k.num_stages, chain=True) for k in render_triton(fx.ugraph).kernels}
    cg = compile_graph(fx.ugraph, device="cpu", launch=launch)
    rng = np.random.default_rng(1)
    xs = [torch.from_numpy(rng.standard_normal(v.type.shape)).to(getattr(torch, dtype)) for v in fx.program.inputs]
    ref = evaluate(fx.program, [x.double().numpy() for x in xs], NumpyDomain())
    run = PersistentRun([(cg, xs)], programs=2)
    for buf in cg.pool.values():
        if buf.dim() and buf.dtype.is_floating_point:
            buf.fill_(float("nan"))
    got = run()[0]
    errs = [float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r)) for o, r in zip(got, ref)]
    return {"tails": len(cg.tails), "launches": run.launches, "waits": run.dependencies, "rel_err": max(errs)}


if __name__ == "__main__":
    if sys.argv[1] == "chained":
        print(json.dumps(chained(sys.argv[2])))
    else:
        print(json.dumps(main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:]))))
