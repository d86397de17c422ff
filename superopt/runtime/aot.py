"""Compile rendered Triton kernels ahead of time for a GPU target, with no GPU present.

A real check of generated code on CPU machines (CI): Triton lowers each kernel through TTIR,
TTGIR, LLVM and PTX to a cubin for the target, so layout, dot-shape and type errors surface here.
"""
from __future__ import annotations

from ..codegen.triton import TritonModule, kernel_param_dtypes
from .build import load_module
from .interpreter import interpreting

_SIG = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "int32": "*i32",
        "int64": "*i64"}


def aot_compile(tm: TritonModule, arch: int = 90, warp_size: int = 32, num_warps: int | None = None,
                num_stages: int | None = None) -> dict:
    """Compile every kernel of ``tm`` for ``cuda:<arch>``; return {kernel name: compiled kernel}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreting():
        raise RuntimeError("aot_compile needs a process without TRITON_INTERPRET (kernels are interpreted)")
    mod = load_module(tm)
    g = tm.graph
    out = {}
    for spec in tm.kernels:
        sig = {name: _SIG[dt] for name, dt in kernel_param_dtypes(spec, g).items()}
        if spec.paired:  # the second instance's pointers (render_triton(paired=True))
            sig.update({f"{name}_b": t for name, t in list(sig.items())})
        # pointers 16-byte aligned, as the JIT specialises torch's allocations: without it Triton
        # assumes 2-byte alignment and neither vectorises nor pipelines the loads
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(sig))}
        src = ASTSource(getattr(mod, spec.name), signature=sig, constexprs={}, attrs=attrs)
        opts = {"num_warps": num_warps or spec.num_warps, "num_stages": num_stages or spec.num_stages}
        out[spec.name] = triton.compile(src, target=GPUTarget("cuda", arch, warp_size), options=opts)
    return out
