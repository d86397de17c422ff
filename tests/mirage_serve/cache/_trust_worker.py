"""Subprocess for the cache-trust tests: build a cached kernel on the Triton path in the interpreter.

    python -m tests.mirage_serve.cache._trust_worker CACHE KEYJSON CASE

Looks ``KEYJSON`` up in the cache at ``CACHE`` exactly as patch() does (``cache.get`` →
``builds.build_of`` → ``backends.build`` → ``compile_graph``), runs the kernel on random inputs in
Triton's CPU interpreter and prints one JSON line: the relative error against the float64
evaluation of fixture ``CASE``'s program, and whether the module that ran is the rendered one.
TRITON_INTERPRET must be set before triton is imported, which a pytest process cannot promise.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mirage_serve import backends  # noqa: E402
from mirage_serve.cache import CacheKey, KernelCache  # noqa: E402
from mirage_serve.cache.builds import build_of  # noqa: E402
from superopt.codegen.triton import render_triton  # noqa: E402
from superopt.interp import NumpyDomain, evaluate  # noqa: E402
from superopt.ir import from_text  # noqa: E402
from tests.superopt.codegen.triton_cases import build  # noqa: E402


def main(cache_dir: str, key_json: str, case: str) -> dict:
    key = CacheKey.from_fields(json.loads(key_json))
    entry = KernelCache(cache_dir, shipped_dir=False).get(key)
    graph = from_text(entry.ugraph_text)
    executor = backends.build(graph, "triton", torch.device("cpu"), None, build_of(entry, key).binaries)
    fx = build(case, "float32")
    rng = np.random.default_rng(7)
    xs = [torch.from_numpy(rng.standard_normal(v.type.shape)).float() for v in fx.program.inputs]
    ref = evaluate(fx.program, [x.double().numpy() for x in xs], NumpyDomain())
    outs = executor.run(*xs)
    err = max(float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r)) for o, r in zip(outs, ref))
    return {"err": err, "rendered": executor.source == render_triton(graph).source,
            "signed": entry.signed, "binaries": len(build_of(entry, key).binaries)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
