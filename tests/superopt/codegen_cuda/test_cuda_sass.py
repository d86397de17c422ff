"""The SASS of generated decode kernels shows the Hopper paths the renderer means to emit:
128-bit weight loads (LDG.E.*.128), cp.async staging (LDGSTS.*.128), and no register spills.

Disassembles NVRTC's sm_90a cubin on the CPU with ``nvdisasm`` (the nvidia-cuda-nvdisasm wheel,
found through cuda.pathfinder) or ``cuobjdump``; skipped where neither is installed.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from superopt.codegen.cuda import compile_cuda, render_cuda
from tests.superopt.codegen_cuda.cases import build
from tests.superopt.codegen_cuda.device_check import qkv_graph


def _disassembler() -> list[str] | None:
    try:
        import cuda.pathfinder as pf
        nd = pf.find_nvidia_binary_utility("nvdisasm")
    except Exception:  # pathfinder too old to know binaries, or none installed
        nd = None
    if nd:
        return [nd, "-c"]
    if shutil.which("cuobjdump"):
        return ["cuobjdump", "-sass"]
    return None


DIS = _disassembler()
pytestmark = pytest.mark.skipif(DIS is None, reason="no nvdisasm (pip nvidia-cuda-nvdisasm) or cuobjdump")
LDG128 = re.compile(r"\bLDG\.E\.[\w.]*128\b")
LDGSTS128 = re.compile(r"\bLDGSTS\.[\w.]*128\b")
SPILL = re.compile(r"\b(LDL|STL)\b")


def sass_of(ugraph, tmp_path) -> str:
    path = tmp_path / "k.cubin"
    path.write_bytes(compile_cuda(render_cuda(ugraph)))
    return subprocess.run(DIS + [str(path)], capture_output=True, text=True, check=True).stdout


def test_decode_matmul_sass(tmp_path):
    sass = sass_of(build("rmsnorm_matmul_b3_k896_n256", "float16").ugraph, tmp_path)
    assert LDG128.search(sass), "no 128-bit global loads"
    assert LDGSTS128.search(sass), "no 16-byte cp.async (LDGSTS)"
    assert not SPILL.search(sass), "register spills (LDL/STL)"


def test_llama_qkv_tile_keeps_16_loads_in_flight(tmp_path):
    """Llama-3-8B qkv at b=1 (K 4096, N 6144), tile 32×256: 8 rows prefetched before the loop and 8
    per iteration, all 128-bit; the M×V partial sums stay in registers."""
    sass = sass_of(qkv_graph(1, 4096, 6144, 32, 256, "bfloat16", 128), tmp_path)
    assert len(LDG128.findall(sass)) >= 16
    assert not SPILL.search(sass), "register spills (LDL/STL)"
