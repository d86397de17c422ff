"""KernelOp: eager calls go straight to the launcher; torch.compile traces the custom op."""
from __future__ import annotations

import torch
from torch._library.triton import is_wrap_triton_enabled
from torch.library import triton_op

from superopt.runtime.build import KernelOp


def test_eager_calls_the_launcher_and_compile_traces_the_custom_op():
    calls = []

    def launch(a: torch.Tensor, o0: torch.Tensor, nw: int, ns: int) -> None:
        calls.append("launch")
        # a direct launch runs with wrap_triton off: wrap_triton(kernel) is the kernel itself
        assert not is_wrap_triton_enabled()
        o0.copy_(a * 2)

    def op_body(a: torch.Tensor, o0: torch.Tensor, nw: int, ns: int) -> None:
        o0.copy_(a * 2)

    op = triton_op("superopt_test::double_kernel", mutates_args=("o0",))(op_body)
    k = KernelOp(launch, op)
    a, o = torch.randn(5), torch.empty(5)
    k(a, o, 4, 3)
    assert calls == ["launch"] and torch.equal(o, a * 2)
    assert is_wrap_triton_enabled()  # restored after the call

    def f(a):
        out = torch.empty_like(a)
        k(a, out, 4, 3)
        return out + 1

    got = torch.compile(f, backend="eager", fullgraph=True)(a)
    assert calls == ["launch"]  # traced through the custom op, not the Python launcher
    assert torch.equal(got, a * 2 + 1)
