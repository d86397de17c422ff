"""superopt.runtime.precompile: kernels compiled in a forked worker (as patch()'s verification pool
does) are what a later build of the same μGraph and launch finds in Triton's cache; CPU only."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import multiprocessing as mp
import sys
from concurrent.futures import ProcessPoolExecutor
from triton.backends.compiler import GPUTarget
from superopt.codegen.launch import Launch
from superopt.codegen.triton import render_triton
from superopt.ir import to_text
from superopt.runtime.precompile import precompile
from tests.superopt.codegen.triton_cases import build

graph = build(sys.argv[1], "bfloat16").ugraph
text, target = to_text(graph), GPUTarget("cuda", 90, 32)
names = [k.name for k in render_triton(graph).kernels]
launch = {n: Launch(2, 3) for n in names}
with ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as pool:
    in_worker = pool.submit(precompile, text, launch, True, target).result()
again = precompile(text, launch, True, target)          # the build after verification: all loaded
other_launch = precompile(text, {n: Launch(4, 3) for n in names}, True, target)
without_pdl = precompile(text, launch, False, target)   # other source: Triton compiles it
print(len(names), in_worker, again, other_launch, without_pdl)
"""


@pytest.mark.parametrize("case", ["rmsnorm_matmul_wide"])
def test_compiled_in_a_worker_then_loaded(tmp_path, case):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT, case], env=env, capture_output=True, text=True,
                         timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    kernels, in_worker, again, other_launch, without_pdl = map(int, out.stdout.split()[-5:])
    assert kernels >= 1
    assert in_worker == kernels        # the worker compiled every kernel
    assert again == 0                  # ... and the parent's build of the same launch compiles none
    assert other_launch == kernels     # a launch the worker did not compile is compiled, not mistaken
    assert without_pdl == kernels


ORDERED = r"""
import sys
from triton.backends.compiler import GPUTarget
from superopt.codegen.triton import render_triton
from superopt.ir import to_text
from superopt.runtime.precompile import precompile
from tests.superopt.codegen.triton_cases import build

graph = build(sys.argv[1], "bfloat16").ugraph
text, target = to_text(graph), GPUTarget("cuda", 90, 32)
summing = sum(1 for k in render_triton(graph).kernels if k.workspaces)
ordered = precompile(text, None, True, target, ordered_sums=True)   # as a deterministic patch precompiles a hit
again = precompile(text, None, True, target, ordered_sums=True)
atomic = precompile(text, None, True, target)
print(len(render_triton(graph).kernels), summing, ordered, again, atomic)
"""


def test_a_deterministic_precompile_compiles_the_ordered_sums_the_build_will_load(tmp_path):
    # PatchOptions.deterministic builds cross-block sums ordered (codegen.triton.render_built); the precompile of a
    # cache hit renders through the same function, so it compiles those kernels, not the atomic ones no build loads
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", ORDERED, "two_way_sums"], env=env, capture_output=True, text=True,
                         timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    kernels, summing, ordered, again, atomic = map(int, out.stdout.split()[-5:])
    assert summing >= 1
    assert ordered == kernels and again == 0
    assert atomic == summing           # the atomic form differs only in the kernels that sum across blocks
