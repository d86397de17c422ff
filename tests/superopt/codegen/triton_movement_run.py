"""Run the searched μGraphs of the data-movement programs in Triton's CPU interpreter; print one
JSON line {case/dtype: relative error against the float64 program}.

Run as ``python -m tests.superopt.codegen.triton_movement_run`` in its own process (TRITON_INTERPRET
must be set before triton is imported); ``--aot`` instead compiles the kernels for sm_90 (no GPU). Each case: the program searched, its best μGraph checked
to be one kernel where the case says so, inputs rounded to the dtype, outputs poisoned with NaN.
"""
from __future__ import annotations

import json
import os
import sys

# only as a script: test_triton_movement imports CASES from here, and a pytest process that set
# TRITON_INTERPRET would run every later test's kernels in the interpreter
if __name__ == "__main__" and "--aot" not in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from superopt.interp import NumpyDomain, evaluate  # noqa: E402
from superopt.interp.movement import random_indices  # noqa: E402
from superopt.runtime import compile_graph  # noqa: E402
from superopt.search import SearchBudget, superoptimize  # noqa: E402
from tests.fixtures import movement as mv  # noqa: E402

# (case, builder, kernels the best μGraph must launch: customized kernels + library ops)
CASES = [
    ("phi3_qkv_split", lambda dt: mv.phi3_qkv(m=3, d=96, heads=4, kv=2, hd=8, dtype=dt), 1),
    ("phi3_gate_up_chunk", lambda dt: mv.phi3_mlp(m=3, d=73, inter=48, dtype=dt), 1),
    ("gqa_repeat_view", lambda dt: mv.gqa_scale(kv=3, rep=4, s=5, hd=8, dtype=dt), 1),
    ("rope_rotate_half", lambda dt: mv.rope(heads=3, hd=8, table=13, dtype=dt), 3),
    # halves that are not a power of two (padded register tiles, gathered): a head dim of 12, and Phi-3's 96
    ("rope_rotate_half_hd12", lambda dt: mv.rope(heads=3, hd=12, table=13, dtype=dt), 3),
    ("rope_rotate_half_hd96", lambda dt: mv.rope(heads=2, hd=96, table=7, dtype=dt), 3),
]
DTYPES = ("float32", "float16")


def run(case: str, build, kernels: int, dtype: str) -> float:
    program = build(dtype)
    best = superoptimize(program, SearchBudget(max_seconds=60)).best
    if best.num_kernels != kernels or not best.customized_nodes():
        raise AssertionError(f"{case}: best μGraph has {best.num_kernels} launches, expected {kernels}")
    rng = np.random.default_rng(0)
    idx = random_indices(program, rng, NumpyDomain())
    xs = [torch.from_numpy(idx[v.name]) if v.name in idx else
          torch.from_numpy(rng.standard_normal(v.type.shape)).to(getattr(torch, dtype)) for v in program.inputs]
    ref = evaluate(program, [x.numpy() if x.dtype == torch.int64 else x.double().numpy() for x in xs], NumpyDomain())
    cg = compile_graph(best, device="cpu")
    for buf in cg.pool.values():
        if buf.dim() and buf.is_floating_point():
            buf.fill_(float("nan"))
    outs = [o.clone() for o in cg(*xs)]
    errs = [float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, ref)]
    return max(errs) if all(np.isfinite(errs)) else float("nan")


AOT = {"gate_up_chunk": lambda: mv.phi3_mlp(m=1, d=256, inter=192, dtype="bfloat16"),
       "qkv_split": lambda: mv.phi3_qkv(m=8, d=256, heads=4, kv=2, hd=32, dtype="bfloat16"),
       "rope": lambda: mv.rope(heads=8, hd=128, table=64, dtype="bfloat16"),
       "rope_hd96": lambda: mv.rope(heads=8, hd=96, table=64, dtype="bfloat16"),
       "gqa_repeat": lambda: mv.gqa_scale(kv=2, rep=4, s=1, hd=128, dtype="bfloat16")}


def aot() -> None:
    """Compile each case's searched kernels for sm_90 (no GPU); print {case: kernels compiled}."""
    from superopt.codegen.triton import render_triton
    from superopt.runtime.aot import aot_compile
    print(json.dumps({case: len(aot_compile(render_triton(superoptimize(build()).best), arch=90))
                      for case, build in AOT.items()}))


def main() -> None:
    if "--aot" in sys.argv:
        return aot()
    out = {}
    for case, build, kernels in CASES:
        for dtype in DTYPES:
            try:
                out[f"{case}/{dtype}"] = run(case, build, kernels, dtype)
            except Exception as e:  # reported per case, so one failure does not hide the others
                out[f"{case}/{dtype}"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
