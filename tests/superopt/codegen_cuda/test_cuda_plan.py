"""Storage decisions of the CUDA renderer: what is staged, double-buffered, streamed, refused."""
from __future__ import annotations

import pytest

from superopt.codegen.cuda import CudaRenderError, render_cuda
from superopt.codegen.cuda_plan import plan_block
from tests.superopt.codegen_cuda.cases import build


def _plan(case: str, dtype: str):
    fx = build(case, dtype)
    n = fx.ugraph.customized_nodes()[0]
    return plan_block(n.block, [fx.ugraph.type_of(a).shape for a in n.args])


def test_decode_matmul_plan():
    """x [3, 896/28] is staged and double-buffered (16-byte cp.async); W's tiles are streamed from
    global by a register GEMV that feeds the accumulator directly and prefetches across iterations."""
    p = _plan("rmsnorm_matmul_b3_k896_n256", "float16")
    x, w = p.inputs["xt_in"], p.inputs["wt_in"]
    assert x.staged and x.double and x.vec == 8
    assert not w.staged and w.vec == 8
    (g,) = p.gemv.values()
    assert (g.M, g.K, g.N, g.V) == (3, 32, 32, 8) and g.into_accum == "acc" and g.b == "wt_in"
    assert g.CG * g.KS <= 128 and g.KS * g.KC >= g.K
    assert "acc" in p.smem_off and "s" not in p.smem_off  # the product never reaches shared memory
    assert p.smem_bytes % 16 == 0 and p.smem_bytes < 48 * 1024


def test_unaligned_rows_fall_back_to_scalar_copies():
    """fp16 rows of 20 columns are not 16-byte multiples: no vectors, no cp.async double buffers."""
    p = _plan("rmsnorm_matmul", "float16")  # W tile [32, 20]
    assert p.inputs["wt_in"].vec == 1 and p.inputs["xt_in"].vec == 8
    (g,) = p.gemv.values()
    assert g.V == 1 and g.N == 20


def test_float64_is_refused_with_a_reason():
    fx = build("rmsnorm_matmul", "float64")
    with pytest.raises(CudaRenderError, match="float64"):
        render_cuda(fx.ugraph)
