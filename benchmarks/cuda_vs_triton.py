"""The CUDA C++ backend against the Triton backend and torch, on registry-model decode blocks.

For each block of one decoder layer of Llama-3.1-8B and Qwen2.5-0.5B (the programs ``patch()``
extracts, residual adds fused: qkv, o_proj + residual, the gated MLP's up part, down_proj +
residual) at 1 and 8 rows, the μGraph the shipped kernel cache holds for it (what ``patch()`` runs
on an H100/H200 without searching) is built by both backends from the same text: Triton with its
stored launch, CUDA C++ through NVRTC. Both are timed as ``patch()`` runs them (CUDA-graph replays
over input sets rotated beyond L2, ``superopt.runtime.timing``), against the program itself run as
torch calls, eagerly (what an unpatched model does) and replayed in a CUDA graph. Each output is
checked against the torch program's in float64 first.

    PYTHONPATH=$PWD python benchmarks/cuda_vs_triton.py --out $OUT/cuda_vs_triton.md

A row whose CUDA build fails says why (the CUDA renderer covers fewer μGraphs than Triton's). The
verdict line counts the rows where CUDA beats Triton by at least 5%.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

MODELS = ("Llama-3.1-8B", "Qwen2.5-0.5B")
# site program labels (mirage_serve.site_programs): q / k,v projections after the norm, o_proj +
# residual, the gated MLP's up part, down_proj + residual
LABELS = ("attn_in", "attn_in_1", "attn_out", "mlp_in", "mlp_out")
WIN = 0.95  # CUDA "wins" a row at ≤ 95% of Triton's time


def _rows(models, rows):
    """(model, label, m, program, shipped entry or None) for each distinct block program."""
    import tempfile

    from mirage_serve.cache import CacheKey, KernelCache, versions_now
    from mirage_serve.site_programs import layer_programs
    from superopt.ir import digest

    # an empty user layer over the shipped one: only shipped entries are found
    cache = KernelCache(tempfile.mkdtemp(prefix="cuda-vs-triton-"), read_only=True)
    seen = set()
    for name in models:
        for label, m, g in layer_programs(name, rows, fused_residual=True):
            if label not in LABELS or (name, label, m) in seen:  # k and v share one program
                continue
            seen.add((name, label, m))
            # the key patch() looks up on an sm_90 GPU in bf16 (benchmarks/shipped_coverage.py)
            key = CacheKey(digest(g), f"b{m}", "bf16", "sm90", "triton", versions_now(), f"{label}-m{m}")
            yield name, label, m, g, cache.get(key, count=False)


def _cubin(job) -> bytes | str:
    """Worker: the NVRTC build of one μGraph text for ``arch`` (CPU only), or why it failed."""
    text, arch = job
    try:
        from superopt.codegen.cuda import compile_cuda, render_cuda
        from superopt.ir import from_text
        return compile_cuda(render_cuda(from_text(text)), arch)
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:80]}"


def _inputs(g, torch, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for v in g.inputs:
        t = torch.randn(v.type.shape, device="cuda", generator=gen, dtype=torch.float32)
        out.append((t / max(1.0, v.type.shape[-1] ** 0.5) if len(v.type.shape) > 1 else t)
                   .to(getattr(torch, v.type.dtype)))
    return out


def _err(got, want) -> float:
    return max(((a.double() - b.double()).norm() / b.double().norm()).item() for a, b in zip(got, want))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = ap.parse_args(argv)

    import torch

    from superopt.codegen.launch import read_launches
    from superopt.ir import from_text
    from superopt.runtime import compile_graph
    from superopt.runtime.cuda_launch import CudaGraphRunner
    from superopt.runtime.timing import copy_bandwidth, rotated_sets, time_call

    t0 = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    arch = f"sm_{props.major}{props.minor}" + ("a" if props.major == 9 else "")
    bw = copy_bandwidth()
    lines = [f"# CUDA C++ vs Triton backend, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"{props.name}, torch {torch.__version__}, copy bandwidth {bw / 1e9:.0f} GB/s; µs per call, "
             f"median of CUDA-graph replays over inputs rotated beyond L2 (torch eager: single calls)", "",
             "| model | block | rows | μGraph | torch eager | torch graph | Triton | CUDA | CUDA/Triton | err T / C |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    wins = timed = 0
    rows = tuple(int(r) for r in args.rows.split(","))
    todo = [(name, label, m, program, entry, from_text(entry.ugraph_text) if entry is not None else program)
            for name, label, m, program, entry in _rows(args.models.split(","), rows)]
    # NVRTC builds need no GPU: all of them side by side while the GPU times the rest
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from superopt.ir import to_text
    pool = ProcessPoolExecutor(min(12, len(todo)), mp_context=multiprocessing.get_context("spawn"))
    cubins = [pool.submit(_cubin, (to_text(t[5]), arch)) for t in todo]
    for (name, label, m, program, entry, graph), cubin in zip(todo, cubins):
        src = "shipped" if entry is not None else "program (no shipped entry)"
        xs = _inputs(program, torch, seed=m)
        sets = rotated_sets(xs)
        torch_prog = compile_graph(program, device="cuda")  # library ops only: torch calls
        want = [t.clone() for t in torch_prog(*xs)]
        cells = {"eager": time_call(torch_prog, sets, graph=False), "graph": time_call(torch_prog, sets)}
        errs = {}

        def triton_build():
            launch = read_launches(entry.meta.get("launch")) if entry is not None else None
            return compile_graph(graph, device="cuda", launch=launch)

        def cuda_build():
            built = cubin.result()
            if isinstance(built, str):
                raise RuntimeError(f"NVRTC: {built}")
            return CudaGraphRunner(graph, built, torch.device("cuda"))

        for key, build in (("triton", triton_build), ("cuda", cuda_build)):
            try:  # a backend that cannot build or run this μGraph loses the row, with its reason
                run = build()
                errs[key] = _err(run(*xs), want)
                cells[key] = time_call(run, sets)
            except Exception as e:
                cells[key], errs[key] = None, f"{type(e).__name__}: {str(e)[:80]}"
        ratio = cells["cuda"] / cells["triton"] if cells["cuda"] and cells["triton"] else None
        if ratio is not None:
            timed += 1
            wins += ratio <= WIN

        def us(v):
            return "—" if v is None else f"{v:.1f}"

        def e(v):
            return v if isinstance(v, str) else f"{v:.0e}"

        row = (f"| {name} | {label} | {m} | {src} | {us(cells['eager'])} | {us(cells['graph'])} | "
               f"{us(cells['triton'])} | {us(cells['cuda'])} | {'—' if ratio is None else f'{ratio:.2f}'} | "
               f"{e(errs['triton'])} / {e(errs['cuda'])} |")
        lines.append(row)
        print(row, flush=True)
    pool.shutdown()
    verdict = (f"CUDA within {WIN:.0%} of Triton's time (a win) on {wins} of {timed} blocks timed by both; "
               f"{time.perf_counter() - t0:.0f} s")
    lines += ["", verdict]
    print(verdict, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
