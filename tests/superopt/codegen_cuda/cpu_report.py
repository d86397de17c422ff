"""Print the CPU-side table of benchmarks/results/cuda_codegen_*.md: per case, its kernels, cubin
size, emulator error (fp16 / bf16, seed 0) and SASS op counts (needs g++ and nvdisasm).

    python -m tests.superopt.codegen_cuda.cpu_report
"""
from __future__ import annotations

import re
import subprocess
import tempfile

import numpy as np

from superopt.codegen.cuda import compile_cuda, render_cuda
from tests.superopt.codegen_cuda import cpu_emulate as emu
from tests.superopt.codegen_cuda.cases import all_cases, build
from tests.fixtures.ugraphs import random_inputs

SASS_OPS = (r"\bLDG\.E\.[\w.]*128\b", r"\bLDGSTS\.[\w.]*128\b", r"\bATOMS\b", r"\b(?:LDL|STL)\b")


def emulator_errors(cases: list[str], dtype: str) -> dict[str, float]:
    fxs = [build(c, dtype) for c in cases]
    modules = [render_cuda(f.ugraph) for f in fxs]
    lib = emu.build(modules)
    out = {}
    for i, (c, fx, m) in enumerate(zip(cases, fxs, modules)):
        xs = random_inputs(fx, np.random.default_rng(0))
        ref = fx.reference([emu.from_storage(emu.to_storage(x, dtype), dtype) for x in xs])
        got = emu.run(m, fx.ugraph, xs, lib, f"m{i}")
        out[c] = max(np.linalg.norm(g - r) / np.linalg.norm(r) for g, r in zip(got, ref))
    return out


def main() -> None:
    import cuda.pathfinder as pf
    nvdisasm = pf.find_nvidia_binary_utility("nvdisasm")
    cases = sorted(all_cases())
    e16, e_bf = emulator_errors(cases, "float16"), emulator_errors(cases, "bfloat16")
    print("| case | kernels (grid, threads, smem B) | cubin B (bf16) | emulator rel err fp16 / bf16 "
          "| SASS: LDG.128 / LDGSTS.128 / ATOMS / LDL+STL |")
    print("|---|---|---|---|---|")
    for c in cases:
        m = render_cuda(build(c, "bfloat16").ugraph)
        cubin = compile_cuda(m)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
        counts = " / ".join(str(len(re.findall(rx, sass))) for rx in SASS_OPS)
        kernels = "; ".join(f"{k.name} {k.grid}×{k.block[0]}, {k.smem_bytes}" for k in m.kernels)
        print(f"| {c} | {kernels} | {len(cubin)} | {e16[c]:.1e} / {e_bf[c]:.1e} | {counts} |")


if __name__ == "__main__":
    main()
