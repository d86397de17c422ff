"""Compile CUDA C++ to a cubin with NVRTC (``cuda.bindings.nvrtc``): no nvcc at run time.

Headers (cuda_fp16.h, cuda_bf16.h) come from the nvidia-cuda-runtime wheel, found through
``cuda.pathfinder``; on a machine with a CUDA toolkit and no wheel, ``$CUDA_HOME/include``.
"""
from __future__ import annotations

import functools
import os

DEFAULT_ARCH = "sm_90a"


class NvrtcError(RuntimeError):
    """NVRTC rejected the source; the message holds the compiler log."""


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> str:
    try:
        import cuda.pathfinder as pf
        found = pf.find_nvidia_header_directory("cudart")
        if found:
            return found
    except (ImportError, AttributeError):  # no cuda.pathfinder, or one too old to find headers
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "include", "cuda_fp16.h")):
            return os.path.join(root, "include")
    raise NvrtcError("no CUDA headers (cuda_fp16.h): install the nvidia-cuda-runtime wheel or set CUDA_HOME")


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    _ok(err, "nvrtcVersion")
    return major, minor


def _ok(err, what: str) -> None:
    from cuda.bindings import nvrtc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{what} failed: {err}")


def compile_cuda(module, arch: str = DEFAULT_ARCH, name: str = "superopt.cu") -> bytes:
    """Compile ``module`` (a CudaModule or source text) for ``arch``; return the cubin bytes."""
    from cuda.bindings import nvrtc
    source = module if isinstance(module, str) else module.source
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _ok(err, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-I" + cuda_include_dir().encode(),
                b"-std=c++17", b"-default-device", b"-lineinfo"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"NVRTC ({arch}) rejected {name}:\n{log}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _ok(err, "nvrtcGetCUBINSize")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
        _ok(err, "nvrtcGetCUBIN")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(prog) -> str:
    from cuda.bindings import nvrtc
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.decode(errors="replace").rstrip("\x00 \n")
