"""CudaGraphRunner's binding logic on the CPU: the driver replaced by the kernel emulator.

Covers what the GPU tests would otherwise be the only check of: which buffer each kernel
parameter receives, zeroed workspaces and finishing kernels, views and library nodes between
kernels, preallocated outputs (poisoned before each call), and operands that are not contiguous
or not 16-byte aligned (the emulator traps on a misaligned vector access, like the GPU faults).
"""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch

from superopt.codegen.cuda import render_cuda
from superopt.runtime.cuda_launch import CudaGraphRunner, CudaLaunchError
from tests.superopt.codegen_cuda import cpu_emulate as emu
from tests.superopt.codegen_cuda.cases import build

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++ (C++20)")
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


class EmulatedKernels:
    """DriverKernels' interface over the emulator: CPU tensors, no stream."""

    def __init__(self, module):
        self.module, self.lib, self.launched = module, emu.build([module]), []

    def stream(self, device):
        return None

    def launch(self, i, buffers, stream):
        spec = self.module.kernels[i]
        for z in spec.zero:
            buffers[z].zero_()
        ptrs = [b.data_ptr() for b in buffers] + list(spec.scalars)
        getattr(self.lib, f"emu_m0_{spec.name}")((ctypes.c_void_p * len(ptrs))(*ptrs))
        self.launched.append(spec.name)


def _runner(case, dtype):
    fx = build(case, dtype)
    module = render_cuda(fx.ugraph)
    kernels = EmulatedKernels(module)
    return fx, CudaGraphRunner(fx.ugraph, device="cpu", module=module, kernels=kernels), kernels


def _inputs(fx, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(v.type.shape, generator=g).to(getattr(torch, dtype)) for v in fx.ugraph.inputs]


def _check(fx, runner, xs, dtype):
    for t in runner.buffers.values():
        t.fill_(float("nan"))
    for t in runner.workspaces.values():
        t.fill_(float("nan"))
    outs = runner(*xs)
    ref = fx.reference([x.double().numpy() for x in xs])
    for o, r in zip(outs, ref):
        got = o.double().numpy()
        assert np.isfinite(got).all()
        err = np.linalg.norm(got - r) / np.linalg.norm(r)
        assert err <= TOL[dtype], f"{fx.name} {dtype}: relative error {err:.3e}"
    return outs


@pytest.mark.parametrize("case,dtype", [("decode_attention_b3_h6_kv2_d64", "bfloat16"),
                                        ("splitk_matmul", "float16"), ("splitk_matmul", "float32")])
def test_runner_binds_buffers(case, dtype):
    fx, runner, kernels = _runner(case, dtype)
    outs = _check(fx, runner, _inputs(fx, dtype, 0), dtype)
    assert kernels.launched == [k.name for k in runner.module.kernels]
    again = _check(fx, runner, _inputs(fx, dtype, 1), dtype)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(outs, again)), "outputs were reallocated"


def test_runner_copies_strided_and_misaligned_operands():
    dtype = "bfloat16"
    fx, runner, _ = _runner("rmsnorm_matmul_b3_k896_n256", dtype)
    x, w = _inputs(fx, dtype, 2)
    x_odd = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)  # 2 bytes past an aligned start
    x_odd.copy_(x)
    w_t = w.t().contiguous().t()                                          # same values, column-major
    assert x_odd.data_ptr() % 16 and not w_t.is_contiguous()
    _check(fx, runner, [x_odd, w_t], dtype)
    assert len(runner.staging) == 2


def test_runner_rejects_wrong_inputs():
    fx, runner, _ = _runner("splitk_matmul", "float16")
    x, w = _inputs(fx, "float16", 0)
    with pytest.raises(TypeError, match="expected"):
        runner(x.float(), w)
    with pytest.raises(CudaLaunchError, match="CUDA device"):
        CudaGraphRunner(fx.ugraph, device="cpu")


def test_custom_op_traces_under_torch_compile():
    """The runner as a torch.library op: same answers eagerly and inside torch.compile (fullgraph)."""
    from superopt.runtime.cuda_op import as_custom_op
    dtype = "float16"
    fx, runner, _ = _runner("splitk_matmul", dtype)
    op = as_custom_op(runner, "test_splitk_matmul_f16")
    xs = _inputs(fx, dtype, 5)
    (eager,) = op(xs)
    assert eager.data_ptr() != runner.buffers[fx.ugraph.outputs[0]].data_ptr()  # a copy, not the buffer

    def f(x, w):
        return op([x, w])[0] * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(*xs), eager * 2)
    (ref,) = fx.reference([x.double().numpy() for x in xs])
    err = np.linalg.norm(eager.double().numpy() - ref) / np.linalg.norm(ref)
    assert err <= TOL[dtype]
