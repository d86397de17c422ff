"""Run searched attention μGraphs in Triton's CPU interpreter; print one JSON line of relative errors.

``python -m tests.superopt.search.attention_interp_run DIR [SCALE]``: DIR holds ``<case>.program.txt`` and
``<case>.ugraph.txt`` (canonical text). Its own process, because TRITON_INTERPRET must be set
before triton is imported. Inputs (unit normals × SCALE, default 1) are rounded to the program's dtype, outputs poisoned with NaN,
the error is against the float64 evaluation of the Lax program on the same inputs.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from superopt.interp import NumpyDomain, evaluate  # noqa: E402
from superopt.interp.movement import random_indices  # noqa: E402
from superopt.ir import from_text  # noqa: E402
from superopt.runtime import compile_graph  # noqa: E402


def run(program_text: str, ugraph_text: str, seed: int = 0, scale: float = 1.0) -> float:
    program, ugraph = from_text(program_text), from_text(ugraph_text)
    rng = np.random.default_rng(seed)
    idx = random_indices(program, rng, NumpyDomain())  # cache positions (int64 inputs)
    xs = [torch.from_numpy(idx[v.name]) if v.name in idx else
          torch.from_numpy(rng.standard_normal(v.type.shape) * scale).to(getattr(torch, v.type.dtype))
          for v in program.inputs]
    ref = evaluate(program, [x.numpy() if x.dtype == torch.int64 else x.double().numpy() for x in xs], NumpyDomain())
    cg = compile_graph(ugraph, device="cpu")
    for buf in cg.pool.values():
        if buf.dim() and buf.is_floating_point():
            buf.fill_(float("nan"))
    outs = cg(*xs)
    errs = [float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, ref)]
    return max(errs) if all(np.isfinite(errs)) else float("nan")


def main(folder: str, scale: float = 1.0) -> None:
    out = {}
    for p in sorted(Path(folder).glob("*.program.txt")):
        case = p.name[: -len(".program.txt")]
        try:
            out[case] = run(p.read_text(), (p.parent / f"{case}.ugraph.txt").read_text(), scale=scale)
        except Exception as e:  # reported per case, so one failure does not hide the others
            out[case] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], *map(float, sys.argv[2:3]))
