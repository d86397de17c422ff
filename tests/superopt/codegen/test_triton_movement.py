"""Searched μGraphs with data movement (split / chunk as block-input offsets and output views, a
head-repeat view, RoPE's rotate_half as a block-level concat), rendered to Triton and run in
Triton's CPU interpreter, match the float64 program (fp32, fp16)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from superopt.codegen.triton import render_triton
from superopt.search import superoptimize
from tests.fixtures import movement as mv
from tests.interpreter import run_interpreted
from tests.superopt.codegen.triton_movement_run import CASES, DTYPES

ROOT = Path(__file__).resolve().parents[3]
TOL = {"float32": 1e-5, "float16": 2e-3}  # CONVENTIONS.md tolerance table


@pytest.fixture(scope="module")
def interp_errors() -> dict:
    return run_interpreted("-m", "tests.superopt.codegen.triton_movement_run", timeout=900)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_interpreted_movement_kernel_matches_float64(interp_errors, case, dtype):
    err = interp_errors[f"{case}/{dtype}"]
    assert not isinstance(err, str), err
    assert math.isfinite(err) and err <= TOL[dtype], f"{case} {dtype}: relative error {err:.3e}"


def test_rendered_source_offsets_and_rotation():
    # the chunk's second half is read at an offset of `inter` rows, never copied
    src = render_triton(superoptimize(mv.phi3_mlp(m=1, d=73, inter=48)).best).source
    assert "+ 48" in src
    # rotate_half: the halves are read at an offset, the concat joins register tiles
    src = render_triton(superoptimize(mv.rope()).best).source
    assert "tl.join(" in src and "+ 4" in src and "tl.gather(" not in src
    # halves of 48 in tiles of 64 (Phi-3's head dim of 96): joined, then gathered into place
    src = render_triton(superoptimize(mv.rope(hd=96)).best).source
    assert "tl.join(" in src and "tl.gather(" in src
    # the GQA head repeat divides the head index
    src = render_triton(superoptimize(mv.gqa_scale()).best).source
    assert "// 4" in src



def test_movement_kernels_compile_for_sm90():
    # Triton lowers the views and the join / permute / reshape of rotate_half to sm_90 cubins (no
    # GPU); in its own process, as this one interprets Triton
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "tests.superopt.codegen.triton_movement_run", "--aot"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    compiled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert compiled == {"gate_up_chunk": 1, "qkv_split": 1, "rope": 1, "rope_hd96": 1, "gqa_repeat": 1}, compiled
