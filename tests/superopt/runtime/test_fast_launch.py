"""FastLaunch: Triton's path once per argument specialisation, then the compiled kernel directly."""
from __future__ import annotations

import torch
from torch._library.triton import set_wrap_triton_enabled
from torch.library import wrap_triton

from superopt.runtime.fast_launch import FastLaunch, launch_wrapper


class _Compiled:
    """Stands in for triton's CompiledKernel: ``compiled[grid](*args)`` launches."""

    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", self.tag, grid, len(args)))


class _Jit:
    """Stands in for a JITFunction: ``kernel[grid](...)`` binds, compiles once per key, launches."""

    def __init__(self, src: str = "def kernel(x_ptr):\n    pass\n"):
        self.log, self.compiled, self.src = [], 0, src

    def __getitem__(self, grid):
        def run(*args, num_warps, num_stages, **options):
            self.compiled += 1
            self.log.append(("triton", grid, num_warps, num_stages, *sorted(options.items())))
            return _Compiled(self.log, self.compiled)
        return run


def test_second_launch_with_the_same_specialisation_skips_triton():
    k = _Jit()
    f = FastLaunch(k)
    a, o = torch.randn(8, 4), torch.empty(8, 4)
    f[(3, 1, 1)](a, o, num_warps=4, num_stages=2)
    f[(3, 1, 1)](a, o, num_warps=4, num_stages=2)
    f[(3, 1, 1)](torch.randn(8, 4), o, num_warps=4, num_stages=2)  # another aligned tensor: same kernel
    assert k.log == [("triton", (3, 1, 1), 4, 2), ("direct", 1, (3, 1, 1), 2), ("direct", 1, (3, 1, 1), 2)]


def test_a_misaligned_dtype_changed_or_relaunched_call_goes_through_triton():
    k = _Jit()
    f = FastLaunch(k)
    base = torch.randn(40)
    aligned, misaligned = base[:32], base[1:33]  # float32: 4 bytes off a 16-byte boundary
    o = torch.empty(32)
    f[(1,)](aligned, o, num_warps=4, num_stages=2)
    f[(1,)](misaligned, o, num_warps=4, num_stages=2)        # Triton specialises on alignment
    f[(1,)](aligned.half(), o, num_warps=4, num_stages=2)    # and on dtype
    f[(1,)](aligned, o, num_warps=8, num_stages=2)           # other launch options
    f[(2,)](aligned, o, num_warps=4, num_stages=2)           # other grid
    assert [e[0] for e in k.log] == ["triton"] * 5
    f[(1,)](misaligned, o, num_warps=4, num_stages=2)
    assert k.log[-1][:2] == ("direct", 2)  # the misaligned call's own compiled kernel


def test_launch_wrapper_is_torchs_while_wrap_triton_is_on():
    import triton

    @triton.jit
    def kernel(x_ptr):
        pass

    traced = launch_wrapper(kernel)  # wrap_triton on (the default; torch.compile traces this)
    assert not isinstance(traced, FastLaunch) and type(traced) is type(wrap_triton(kernel))
    with set_wrap_triton_enabled(False):  # a direct launch (KernelOp, triton_op's eager call)
        fast = launch_wrapper(kernel)
        assert isinstance(fast, FastLaunch) and fast.kernel is kernel
        assert launch_wrapper(kernel) is fast  # one per kernel


def test_a_kernel_of_a_module_rendered_with_pdl_is_launched_with_pdl():
    from superopt.codegen.triton import PDL_SIGNAL, PDL_WAIT
    from superopt.runtime.grid_dependency import launch_options

    k = _Jit(f"def kernel(x_ptr):\n    {PDL_WAIT}\n    {PDL_SIGNAL}\n")
    f = FastLaunch(k, launch_options(True))
    a = torch.randn(8)
    f[(1,)](a, num_warps=4, num_stages=2)
    f[(1,)](a, num_warps=4, num_stages=2)  # the compiled kernel keeps the option: launched directly
    assert k.log == [("triton", (1,), 4, 2, ("launch_pdl", True)), ("direct", 1, (1,), 1)]
    plain = _Jit()
    FastLaunch(plain)[(1,)](a, num_warps=4, num_stages=2)
    assert plain.log == [("triton", (1,), 4, 2)]
