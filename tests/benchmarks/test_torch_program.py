"""benchmarks/torch_program.py: a Lax program as torch calls, the block table's baseline and reference."""
from __future__ import annotations

import numpy as np
import torch

from benchmarks import torch_program as tp
from superopt.interp.evaluate import evaluate
from superopt.interp.numpy_domain import NumpyDomain
from tests.fixtures.attention import decode_attention


def test_float64_reference_keeps_float64_through_the_programs_casts():
    # The extracted attention casts to float32 for the softmax and back to the storage dtype for p·v;
    # the reference must stay float64 (mixing dtypes in matmul raised on the GPU in session 31).
    fx = decode_attention(batch=2, q_heads=6, kv_heads=2, head_dim=16, kv_len=37, as_extracted=True,
                          dtype="bfloat16")
    assert "cast" in [n.op for n in fx.program.nodes]
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(v.type.shape, generator=g, dtype=torch.float64) for v in fx.program.inputs]
    (ref,) = tp.torch_program(fx.program)(*xs)
    (want,) = evaluate(fx.program, {v.name: x.numpy() for v, x in zip(fx.program.inputs, xs)}, NumpyDomain())
    assert ref.dtype == torch.float64
    np.testing.assert_allclose(ref.numpy(), want, rtol=1e-12, atol=1e-12)


def test_storage_dtype_run_rounds_where_the_program_casts():
    fx = decode_attention(batch=1, q_heads=4, kv_heads=1, head_dim=16, kv_len=19, as_extracted=True,
                          dtype="bfloat16")
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(v.type.shape, generator=g).to(torch.bfloat16) for v in fx.program.inputs]
    (out,) = tp.torch_program(fx.program)(*xs)
    (ref,) = tp.torch_program(fx.program)(*[x.double() for x in xs])
    assert out.dtype == torch.bfloat16
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-2  # bf16 row of CONVENTIONS.md
