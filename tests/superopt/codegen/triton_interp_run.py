"""Run every Triton test case in Triton's CPU interpreter and print one JSON line of errors.

Run as ``python -m tests.superopt.codegen.triton_interp_run [case ...]`` in its own process:
TRITON_INTERPRET must be set before triton is imported, which a pytest process cannot promise.
Each case: inputs rounded to the dtype, outputs poisoned with NaN, the compiled graph run on CPU,
the relative Frobenius error against the float64 evaluation of the Lax program on the same inputs.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from superopt.interp import NumpyDomain, evaluate  # noqa: E402
from superopt.codegen.launch import Launch  # noqa: E402
from superopt.codegen.triton import render_triton  # noqa: E402
from superopt.runtime import compile_graph  # noqa: E402
from tests.superopt.codegen.triton_cases import CASES, CHAIN_CASES, INTERP_DTYPES, SUMMED_CASES, build  # noqa: E402


def run_case(case_id: str, dtype: str, seed: int = 0, prefetch: bool = False, chain: bool = False,
             ordered: bool = False) -> tuple[float, bool]:
    """(relative error, whether the bound call matches); ``prefetch``: every kernel rendered with its
    loads one iteration ahead (the profiler's launch variant); ``chain``: a kernel that can run its
    consumer does (``ir.chain``; an error where none can); ``ordered``: cross-block sums added in a fixed
    order (``Launch.ordered``)."""
    fx = build(case_id, dtype)
    rng = np.random.default_rng(seed)
    xs = [torch.from_numpy(rng.standard_normal(v.type.shape)).to(getattr(torch, dtype)) for v in fx.program.inputs]
    ref = evaluate(fx.program, [x.double().numpy() for x in xs], NumpyDomain())
    launch = None
    if prefetch or chain:  # ordered alone: asked of compile_graph, as patch() asks it (PatchOptions.deterministic)
        launch = {k.name: Launch(k.num_warps, k.num_stages, prefetch, chain, ordered)
                  for k in render_triton(fx.ugraph).kernels}
    cg = compile_graph(fx.ugraph, device="cpu", launch=launch, ordered_sums=ordered and launch is None)
    if prefetch and not chain and cg.launch != launch:
        raise AssertionError(f"launch {cg.launch} does not keep the prefetch mark of {launch}")
    if chain and (not cg.tails or any(cg.launch[k] != launch[k] for k in cg.launch)):
        raise AssertionError(f"no kernel runs its consumer: launch {cg.launch}")
    if ordered and ("atomic_add(w" in cg.module.source or not any(k.parts for k in cg.module.kernels)):
        raise AssertionError("a cross-block sum is still added atomically, or none is ordered")
    for buf in [*cg.pool.values(), *(cg.workspace.values() if ordered else ())]:  # ordered slots: never reset
        if buf.dim():
            buf.fill_(float("nan"))
    outs = [o.clone() for o in cg(*xs)]
    errs = [float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, ref)]
    return max(errs) if all(np.isfinite(errs)) else float("nan"), _bound_matches(cg, xs, outs)


def _bound_matches(cg, xs, outs) -> bool:
    """``cg.bind`` with every other input fixed gives exactly the plain call's outputs."""
    for buf in cg.pool.values():
        if buf.dim():
            buf.fill_(float("nan"))
    call = cg.bind([None if i % 2 == 0 else x for i, x in enumerate(xs)])
    got = call(*xs[0::2])
    return all(torch.equal(g, o) for g, o in zip(got, outs)) and len(got) == len(outs)


def run_paired(case_id: str, dtype: str, seed: int = 0) -> float:
    """Two instances of the case's graph in one paired launch (``PairedGraph``): the first input
    shared and given per call, every other input drawn for each instance; the larger relative
    error of the two instances against their float64 evaluations."""
    from superopt.runtime.paired import PairedGraph

    fx = build(case_id, dtype)
    rng = np.random.default_rng(seed)

    def draw():
        return [torch.from_numpy(rng.standard_normal(v.type.shape)).to(getattr(torch, dtype))
                for v in fx.program.inputs]
    xa, xb = draw(), draw()
    xb[0] = xa[0]
    a, b = compile_graph(fx.ugraph, device="cpu"), compile_graph(fx.ugraph, device="cpu")
    paired = PairedGraph(a, b)
    for cg in (a, b):
        for buf in cg.pool.values():
            if buf.dim():
                buf.fill_(float("nan"))
    outs = paired.bind([None, *xa[1:]], [None, *xb[1:]])(xa[0])
    n = len(fx.ugraph.outputs)
    errs = []
    for xs, got in ((xa, outs[:n]), (xb, outs[n:])):
        ref = evaluate(fx.program, [x.double().numpy() for x in xs], NumpyDomain())
        errs += [float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r)) for o, r in zip(got, ref)]
    return max(errs) if all(np.isfinite(errs)) else float("nan")


def run_site_pairing(dtype: str = "float32") -> bool:
    """mirage_serve's Pairing on the found k/v program (activations given per call, weights fixed):
    under the interpreter it takes the paired launch, whose outputs equal the two separate calls'."""
    from mirage_serve.backends import Executor
    from mirage_serve.patching.pairing import Pairing
    from mirage_serve.patching.prepare import BucketKernel, bound_call

    fx = build("found_kv_split_k", dtype)
    act = next(i for i, v in enumerate(fx.program.inputs) if len(v.type.shape) == 2 and v.type.shape[0] == 1)
    rng = np.random.default_rng(3)

    def kernel():
        feeds = tuple(None if i == act else
                      torch.from_numpy(rng.standard_normal(v.type.shape)).to(getattr(torch, dtype))
                      for i, v in enumerate(fx.program.inputs))
        cg = compile_graph(fx.ugraph, device="cpu")
        return BucketKernel(Executor(cg, "triton", False, 0, 0.0), feeds, 1)
    a, b = kernel(), kernel()
    pairing = Pairing(torch.device("cpu"))
    call = pairing.call(a, b, 1)
    x = torch.from_numpy(rng.standard_normal(fx.program.inputs[act].type.shape)).to(getattr(torch, dtype))
    want = [o.clone() for o in bound_call(a)(x)] + [o.clone() for o in bound_call(b)(x)]
    got = call(x) if call is not None else []
    return ("interpreter" in (pairing.note(a, b) or "") and len(got) == len(want)
            and all(torch.equal(g, w) for g, w in zip(got, want)))


def main(argv: list[str]) -> None:
    ids = argv or [c[0] for c in CASES]
    result = {}
    for cid in ids:
        for dt in INTERP_DTYPES:
            try:
                result[f"{cid}/{dt}"], result[f"{cid}/{dt}/bound"] = run_case(cid, dt)
            except Exception as e:  # reported per case, so one failure does not hide the others
                result[f"{cid}/{dt}"] = result[f"{cid}/{dt}/bound"] = f"{type(e).__name__}: {e}"
            try:
                result[f"{cid}/{dt}/prefetch"], _ = run_case(cid, dt, prefetch=True)
            except Exception as e:
                result[f"{cid}/{dt}/prefetch"] = f"{type(e).__name__}: {e}"
            if cid in SUMMED_CASES:
                try:
                    result[f"{cid}/{dt}/ordered"], result[f"{cid}/{dt}/ordered/bound"] = run_case(cid, dt, ordered=True)
                except Exception as e:
                    result[f"{cid}/{dt}/ordered"] = result[f"{cid}/{dt}/ordered/bound"] = f"{type(e).__name__}: {e}"
            if cid in CHAIN_CASES:
                try:
                    result[f"{cid}/{dt}/chain"], result[f"{cid}/{dt}/chain/bound"] = run_case(cid, dt, chain=True)
                except Exception as e:
                    result[f"{cid}/{dt}/chain"] = result[f"{cid}/{dt}/chain/bound"] = f"{type(e).__name__}: {e}"
            if cid in CHAIN_CASES and cid in SUMMED_CASES:  # a split-K producer chained, its sums ordered
                try:
                    result[f"{cid}/{dt}/chain_ordered"], _ = run_case(cid, dt, chain=True, ordered=True)
                except Exception as e:
                    result[f"{cid}/{dt}/chain_ordered"] = f"{type(e).__name__}: {e}"
            try:
                result[f"{cid}/{dt}/paired"] = run_paired(cid, dt)
            except Exception as e:
                result[f"{cid}/{dt}/paired"] = f"{type(e).__name__}: {e}"
    if not argv:
        try:
            result["site_pairing"] = run_site_pairing()
        except Exception as e:
            result["site_pairing"] = f"{type(e).__name__}: {e}"
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
