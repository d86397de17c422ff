"""One device run for the CUDA backend: versions, GPU tests, SASS of one cubin, block timings.

    PYTHONPATH=$PWD python -m tests.superopt.codegen_cuda.device_check [OUT_DIR]

Writes pytest_gpu.log, sass_rmsnorm_matmul.txt and timings.md under OUT_DIR (default: ./cuda_out)
and prints a short summary. Timings: each callable is captured 30 times in one CUDA graph (weights
rotated over copies totalling > 150 MB, beyond L2), the graph replayed 20 times, median per call;
bandwidth as bytes the block must move ÷ time, next to a device-to-device copy measured here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time


def _versions() -> str:
    import torch
    import cuda.bindings
    from superopt.codegen.cuda_nvrtc import cuda_include_dir, nvrtc_version
    p = torch.cuda.get_device_properties(0)
    return (f"device: {p.name}, {p.multi_processor_count} SMs; torch {torch.__version__}; "
            f"cuda-bindings {cuda.bindings.__version__}; NVRTC {nvrtc_version()}; headers {cuda_include_dir()}")


def _graph_time(fn, calls: int = 30, reps: int = 20) -> float:
    """Median µs per call of ``fn(i)``, captured ``calls`` times in one CUDA graph."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def qkv_graph(rows: int, k: int, n: int, n_tile: int, k_tile: int, dtype: str, threads: int = 128):
    """RMSNorm(x, g) · W as one customized op, N split by the grid, K walked by the loop."""
    from superopt.lax import Program
    from tests.fixtures.build import BlockBuilder, KernelBuilder, rms_scale
    p = Program("qkv")
    x, g, w = p.input("x", (rows, k), dtype), p.input("g", (k,), dtype), p.input("w", (k, n), dtype)
    p.output(p.matmul(p.rms_norm(x, g, 1e-6), w))
    kb = KernelBuilder(p.build(), f"qkv_{rows}x{k}x{n}_t{n_tile}x{k_tile}")
    b = BlockBuilder((1, n // n_tile, 1), k // k_tile, threads)
    b.load("xt", 0, x.type, (-1, -1, -1), 1, "float32")
    b.load("gt", 1, g.type, (-1, -1, -1), 0, "float32")
    b.load("wt", 2, w.type, (-1, 1, -1), 0, "float32")
    b.op("xg", "mul", "xt", "gt", fuse=True)
    b.op("s", "matmul", "xg", "wt")
    b.op("sq", "square", "xt", fuse=True)
    b.op("r", "reduce_sum", "sq", dim=1, keepdim=1)
    b.op("acc", "accum_sum", "s")
    b.op("acc_sq", "accum_sum", "r")
    b.op("y", "mul", "acc", rms_scale(b, "acc_sq", k, 1e-6, "float32"))
    b.store("y", (-1, 1, -1), dtype)
    (o,) = kb.customized(["x", "g", "w"], b, ["out"])
    return kb.build(o)


BENCH = [  # (rows, K, N, n_tile, k_tile, threads): Llama-3-8B qkv at b=1 and 8, Qwen2.5-0.5B qkv at b=1
    (1, 4096, 6144, 32, 256, 128), (1, 4096, 6144, 16, 512, 128), (1, 4096, 6144, 64, 512, 256),
    (1, 4096, 6144, 64, 256, 256), (1, 4096, 6144, 16, 256, 64), (1, 4096, 6144, 32, 512, 256),
    (8, 4096, 6144, 32, 256, 128), (8, 4096, 6144, 16, 512, 128), (1, 896, 1152, 32, 128, 128),
]


ATTN = dict(batch=1, q_heads=32, kv_heads=8, head_dim=128, kv_len=4096)  # Llama-3-8B decode, 4096 tokens


def _attention_fixture():
    from tests.fixtures.ugraphs import FIXTURES
    return FIXTURES["decode_attention"](dtype="bfloat16", **ATTN)


def _compile_bench(cfg) -> bytes:
    from superopt.codegen.cuda import compile_cuda, render_cuda
    if cfg == "attention":
        return compile_cuda(render_cuda(_attention_fixture().ugraph))
    rows, k, n, nt, kt, threads = cfg
    return compile_cuda(render_cuda(qkv_graph(rows, k, n, nt, kt, "bfloat16", threads)))


def _attention_row(lines: list[str], cubin: bytes, copy: float) -> None:
    """The decode_attention fixture's own tiling (split-KV + combine) against torch SDPA."""
    import torch
    import torch.nn.functional as F
    from superopt.codegen.cuda import render_cuda
    from superopt.runtime.cuda_launch import CudaGraphRunner
    fx = _attention_fixture()
    runner = CudaGraphRunner(fx.ugraph, cubin, "cuda", render_cuda(fx.ugraph))
    b, hq, hk, d, L = (ATTN[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    dt, sets = torch.bfloat16, 5
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=dt)
    kv = [(torch.randn(b, hk, L, d, device="cuda", dtype=dt), torch.randn(b, hk, L, d, device="cuda", dtype=dt))
          for _ in range(sets)]
    k0, v0 = kv[0]
    ref = F.scaled_dot_product_attention(q.double(), k0.double().repeat_interleave(hq // hk, 1),
                                         v0.double().repeat_interleave(hq // hk, 1))
    got = runner(q, k0, v0)[0].double()
    err = ((got - ref).norm() / ref.norm()).item()
    ours = _graph_time(lambda i: runner(q, *kv[i % sets]))
    eager = _graph_time(lambda i: F.scaled_dot_product_attention(q, *kv[i % sets], enable_gqa=True))
    gb = 2 * b * hk * L * d * 2 / ours / 1e3
    lines.append(f"| decode attention | b{b} Hq{hq} Hkv{hk} d{d} L{L} | fixture tiling | {ours:.1f} | {eager:.1f} | "
                 f"{gb:.0f} | {100 * gb / copy:.0f}% | {eager / ours:.2f} | {err:.1e} |")


def bench(lines: list[str]) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch
    from superopt.codegen.cuda import render_cuda
    from superopt.runtime.cuda_launch import CudaGraphRunner
    from superopt.runtime.timing import copy_bandwidth
    with ProcessPoolExecutor(len(BENCH) + 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        *cubins, attn_cubin = list(pool.map(_compile_bench, BENCH + ["attention"], timeout=300))
    copy = copy_bandwidth() / 1e9  # GB/s, bytes read + written
    lines += [f"device-to-device copy: {copy:.0f} GB/s", "",
              "| block | rows×K×N | tile n×k, threads | ours µs | torch eager µs | ours GB/s | % copy | eager/ours | rel err |",
              "|---|---|---|---|---|---|---|---|---|"]
    dt = torch.bfloat16
    for (rows, k, n, n_tile, k_tile, threads), cubin in zip(BENCH, cubins):
        copies = max(3, int(160e6 // (k * n * 2)) + 1)
        ws = [torch.randn(k, n, device="cuda", dtype=dt) * 0.02 for _ in range(copies)]
        x, g = torch.randn(rows, k, device="cuda", dtype=dt), torch.rand(k, device="cuda", dtype=dt) + 0.5
        graph = qkv_graph(rows, k, n, n_tile, k_tile, "bfloat16", threads)
        runner = CudaGraphRunner(graph, cubin, "cuda", render_cuda(graph))
        ref = torch.nn.functional.rms_norm(x.float(), (k,), g.float(), 1e-6) @ ws[0].float()
        got = runner(x, g, ws[0])[0].float()
        err = ((got - ref).norm() / ref.norm()).item()
        ours = _graph_time(lambda i: runner(x, g, ws[i % copies]))
        eager = _graph_time(lambda i: torch.nn.functional.rms_norm(x, (k,), g, 1e-6) @ ws[i % copies])
        gb = (k * n + rows * k + k + rows * n) * 2 / ours / 1e3
        lines.append(f"| qkv | {rows}×{k}×{n} | {n_tile}×{k_tile}, {threads} | {ours:.1f} | {eager:.1f} | "
                     f"{gb:.0f} | {100 * gb / copy:.0f}% | {eager / ours:.2f} | {err:.1e} |")
        del ws
    try:
        _attention_row(lines, attn_cubin, copy)
    except Exception as e:
        lines.append(f"| decode attention | failed: {type(e).__name__}: {e} |")


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "cuda_out"
    os.makedirs(out, exist_ok=True)
    try:
        versions = _versions()
    except Exception as e:  # no GPU, no NVRTC: say so and carry on with what can run
        versions = f"versions incomplete: {type(e).__name__}: {e}"
    lines = [f"# CUDA codegen device check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", versions, ""]
    print(lines[1], flush=True)
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "--tb=short", "-p", "no:cacheprovider",
                        "tests/superopt/codegen_cuda/test_cuda_gpu.py"], capture_output=True, text=True)
    with open(os.path.join(out, "pytest_gpu.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    lines.append(f"GPU tests (tests/superopt/codegen_cuda/test_cuda_gpu.py): {tail} in {time.time() - t:.0f}s")
    print(r.stdout[-6000:], flush=True)
    try:
        from superopt.codegen.cuda import compile_cuda, render_cuda
        from tests.superopt.codegen_cuda.cases import build
        cubin = os.path.join(out, "rmsnorm_matmul.cubin")
        with open(cubin, "wb") as f:
            f.write(compile_cuda(render_cuda(build("rmsnorm_matmul_b3_k896_n256", "float16").ugraph)))
        try:
            sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
        finally:
            os.remove(cubin)
        with open(os.path.join(out, "sass_rmsnorm_matmul.txt"), "w") as f:
            f.write(sass)
        counts = {op: len(re.findall(rx, sass)) for op, rx in (
            ("LDG 128-bit", r"\bLDG\.E\.[\w.]*128\b"), ("LDGSTS 128-bit", r"\bLDGSTS\.[\w.]*128\b"),
            ("ATOMS", r"\bATOMS\b"), ("BAR.SYNC", r"\bBAR\.SYNC\b"), ("LDL/STL", r"\b(?:LDL|STL)\b"))}
        lines.append(f"SASS of rmsnorm_matmul_b3_k896_n256 (fp16): {counts}")
    except Exception as e:
        lines.append(f"SASS dump failed: {e}")
    lines.append("")
    try:
        bench(lines)
    except Exception as e:
        lines.append(f"bench failed: {type(e).__name__}: {e}")
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(out, "timings.md"), "w") as f:
        f.write(text + "\n")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
