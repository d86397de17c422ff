"""Subprocess for the build-cache tests: a fresh interpreter (own TRITON_CACHE_DIR, no Triton state).

    python -m tests.mirage_serve.cache._builds_worker aot CASE OUT_DIR        # build for sm_90 on CPU, export
    python -m tests.mirage_serve.cache._builds_worker load CASE CACHE KEYJSON  # seed from the entry, build again
    python -m tests.mirage_serve.cache._builds_worker gpu CASE OUT_DIR [CACHE KEYJSON]   # compile_graph on CUDA
    python -m tests.mirage_serve.cache._builds_worker patch CACHE               # patch a tiny Llama on CUDA

Prints one JSON line: what Triton did (kernels compiled / loaded) and, for ``load``, whether the
cubin Triton loaded is byte-identical to the stored one.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _module(case: str):
    from superopt.codegen.triton import render_triton
    from tests.superopt.codegen.triton_cases import build

    return render_triton(build(case, "bfloat16").ugraph)


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _entry_build(cache_dir: str, key_json: str):
    from mirage_serve.cache import CacheKey, KernelCache
    from mirage_serve.cache.builds import load_build

    cache = KernelCache(cache_dir, shipped_dir=False)
    return load_build(cache, CacheKey.from_fields(json.loads(key_json)))


def aot(case: str, out: str) -> dict:
    from superopt.runtime import binaries
    from superopt.runtime.build import load_module

    tm = _module(case)
    log = binaries.warmup(tm, load_module(tm), target=_target())
    files = binaries.export_files(log.hashes)
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        Path(out, name).write_bytes(data)
    Path(out, "source.py").write_text(tm.source)
    return {"compiled": log.compiled, "loaded": log.loaded, "files": sorted(files)}


def load(case: str, cache_dir: str, key_json: str) -> dict:
    from triton.runtime.cache import get_cache_manager

    from superopt.runtime import binaries
    from superopt.runtime.build import load_module

    stored = _entry_build(cache_dir, key_json)
    tm = _module(case)
    seeded = binaries.seed(stored.binaries)
    log = binaries.warmup(tm, load_module(tm), target=_target())
    same = []
    for name, h in log.hashes.items():
        group = get_cache_manager(h).get_group(f"{name}.json")
        cubin = next(p for t, p in group.items() if t.endswith(".cubin"))
        flat = f"{name}.{h[:16]}.cubin"
        same.append(Path(cubin).read_bytes() == stored.binaries.get(flat))
    return {"compiled": log.compiled, "loaded": log.loaded, "seeded": seeded, "same_cubin": same}


def gpu(case: str, out: str, cache_dir: str | None = None, key_json: str | None = None) -> dict:
    import torch

    from superopt.runtime import compile_graph

    tm = _module(case)
    stored = _entry_build(cache_dir, key_json) if cache_dir else None
    cg = compile_graph(tm.graph, device="cuda", binaries=stored and stored.binaries)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(v.type.shape, generator=gen).to("cuda", getattr(torch, v.type.dtype))
          for v in tm.graph.inputs]
    from superopt.runtime import binaries
    from superopt.runtime.build import load_module

    mod = load_module(cg.module)
    with binaries.watch([getattr(mod, k.name) for k in cg.module.kernels]) as at_launch:
        outs = [o.float().cpu() for o in cg(*xs)]  # kernels were built at compile_graph: nothing here
        torch.cuda.synchronize()
    compiles_after_launch = cg.compiles
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, data in cg.binaries().items():
        Path(out, name).write_bytes(data)
    Path(out, "source.py").write_text(cg.source)
    return {"compiles": compiles_after_launch, "loaded": cg.loaded, "files": sorted(cg.binaries()),
            "at_launch": at_launch.compiled + at_launch.loaded,
            "outs": [o.double().flatten().tolist()[:64] + [o.double().norm().item()] for o in outs]}


def patch(cache_dir: str) -> dict:
    """patch() a 2-layer Llama (bf16, CUDA) with the cache `cache_dir`; its report and greedy tokens."""
    import torch
    from transformers import LlamaConfig

    import mirage_serve
    from tests.patches.parity import build as build_model

    from tests.fixtures.budget import states_budget

    budget = states_budget()
    cfg = LlamaConfig(vocab_size=1001, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = build_model(cfg).to("cuda", torch.bfloat16)
    ids = torch.randint(1, 1001, (3, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    r = mirage_serve.patch(model, cache_dir=cache_dir, search_budget=budget, batch_sizes=(1, 4))
    got = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    return {"searches": r.searches, "reinstantiated": r.reinstantiated, "compiles": r.compiles,
            "cache_hits": r.cache_hits, "programs": r.programs, "unpatched": len(r.unpatched),
            "seconds": r.seconds, "tokens": got.tolist(), "report": str(r)}


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    print(json.dumps({"aot": aot, "load": load, "gpu": gpu, "patch": patch}[mode](*args)))
