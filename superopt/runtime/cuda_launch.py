"""Load an NVRTC cubin and run a μGraph's CUDA kernels on the current torch stream.

``CudaGraphRunner(ugraph, cubin, device)`` loads the cubin once (``cuModuleLoadData``) and
allocates once every buffer a call writes: node results, float32 workspaces of cross-block sums,
constants, and aligned copies of strided or misaligned kernel operands. A call then only
enqueues work on ``torch.cuda.current_stream()``: ``cuMemsetD32Async`` for buffers a kernel
accumulates into, ``cuLaunchKernel`` for the kernels, torch ``out=`` ops for library nodes
(runtime.library; views are free). No host sync, no allocation after the first call, so calls
can be captured in a CUDA graph. Returned outputs are the runner's buffers, overwritten by the
next call.
"""
from __future__ import annotations

import ctypes
import torch

from ..codegen.cuda import CudaModule, compile_cuda, render_cuda
from ..ir import KernelGraph, check
from .dtypes import TORCH_DTYPES
from .library import run_library, view

_VIEWS = ("reshape", "transpose", "slice")
_STATIC_SMEM = 48 * 1024  # above this a kernel needs the dynamic shared-memory opt-in


class CudaLaunchError(RuntimeError):
    pass


def _check(result, what: str):
    from cuda.bindings import driver
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise CudaLaunchError(f"{what}: {err} ({msg.decode() if msg else '?'})")
    return rest[0] if len(rest) == 1 else rest


def _ensure_context(device: torch.device) -> None:
    """Make ``device``'s primary context (the one torch uses) current on this thread."""
    from cuda.bindings import driver
    with torch.cuda.device(device):
        torch.empty(1, device=device)  # torch creates the primary context lazily
    _check(driver.cuInit(0), "cuInit")
    dev = _check(driver.cuDeviceGet(device.index), "cuDeviceGet")
    ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class _Launch:
    """One kernel launch with its parameter block built once; pointers are refreshed per call."""

    def __init__(self, spec, func):
        self.spec, self.func = spec, func
        n = len(spec.params) + len(spec.scalars)
        self.values = (ctypes.c_uint64 * max(n, 1))()
        self.ptrs = (ctypes.c_void_p * max(n, 1))(
            *[ctypes.addressof(self.values) + 8 * i for i in range(max(n, 1))])
        for j, s in enumerate(spec.scalars):
            self.values[len(spec.params) + j] = s

    def __call__(self, buffers: list[torch.Tensor], stream) -> None:
        from cuda.bindings import driver
        for i, t in enumerate(buffers):
            self.values[i] = t.data_ptr()
        for z in self.spec.zero:
            _check(driver.cuMemsetD32Async(driver.CUdeviceptr(buffers[z].data_ptr()), 0,
                                           self.spec.params[z].numel, stream),
                   "cuMemsetD32Async")
        g, b = self.spec.grid, self.spec.block
        _check(driver.cuLaunchKernel(self.func, g[0], g[1], g[2], b[0], b[1], b[2], self.spec.smem_bytes,
                                     stream, ctypes.addressof(self.ptrs), 0), f"cuLaunchKernel {self.spec.name}")


class DriverKernels:
    """The driver side of a runner: the cubin loaded once, one prepared launch per KernelSpec."""

    def __init__(self, module: CudaModule, cubin: bytes, device: torch.device):
        from cuda.bindings import driver
        _ensure_context(device)
        self._cumodule = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self._launches = []
        for spec in module.kernels:
            func = _check(driver.cuModuleGetFunction(self._cumodule, spec.name.encode()), "cuModuleGetFunction")
            if spec.smem_bytes > _STATIC_SMEM:
                attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                _check(driver.cuFuncSetAttribute(func, attr, spec.smem_bytes), "cuFuncSetAttribute")
            self._launches.append(_Launch(spec, func))

    def stream(self, device: torch.device):
        from cuda.bindings import driver
        return driver.CUstream(torch.cuda.current_stream(device).cuda_stream)

    def launch(self, i: int, buffers: list[torch.Tensor], stream) -> None:
        """Enqueue kernel ``module.kernels[i]`` (zeroing the buffers its spec lists first)."""
        self._launches[i](buffers, stream)

    def __del__(self):
        try:
            from cuda.bindings import driver
            driver.cuModuleUnload(self._cumodule)
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


class CudaGraphRunner:
    """Callable ``runner(*inputs) -> list[Tensor]``, inputs in ``ugraph.inputs`` order.

    ``kernels`` replaces the driver (``DriverKernels``) by any object with the same ``stream`` and
    ``launch`` methods: the tests run the binding logic on the CPU with emulated kernels.
    """

    def __init__(self, ugraph: KernelGraph, cubin: bytes | None = None, device: str | torch.device = "cuda",
                 module: CudaModule | None = None, kernels=None):
        self.graph = check(ugraph)
        self.device = torch.device(device)
        self.module = module or render_cuda(ugraph)
        if kernels is None:
            if self.device.type != "cuda":
                raise CudaLaunchError(f"CudaGraphRunner needs a CUDA device, got {self.device}")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.cubin = cubin if cubin is not None else compile_cuda(self.module)
            kernels = DriverKernels(self.module, self.cubin, self.device)
        self.kernels = kernels
        self.specs_of: dict[int, list[int]] = {}  # node index -> its kernels, in launch order
        for i, spec in enumerate(self.module.kernels):
            self.specs_of.setdefault(spec.node, []).append(i)
        self.buffers: dict[str, torch.Tensor] = {}     # results written by every call
        self.constants: dict[str, torch.Tensor] = {}   # kernel-level const nodes, filled once
        self.workspaces: dict[tuple[int, int], torch.Tensor] = {}
        for idx, n in enumerate(ugraph.nodes):
            if n.op in _VIEWS:
                continue
            for v in n.outs:
                buf = torch.empty(v.type.shape, dtype=TORCH_DTYPES[v.type.dtype], device=self.device)
                if n.op == "const":
                    self.constants[v.name] = buf.fill_(n.attr("value"))
                else:
                    self.buffers[v.name] = buf
        for k in self.module.kernels:
            for b in k.params:
                if b.role == "ws":
                    self.workspaces.setdefault((k.node, b.index), torch.empty(
                        b.numel, dtype=torch.float32, device=self.device))
        self.staging: dict[tuple[int, int], torch.Tensor] = {}

    def _operand(self, idx: int, j: int, t: torch.Tensor) -> torch.Tensor:
        """Kernels index operands as contiguous and 16-byte aligned; copy into a kept buffer if not."""
        if t.is_contiguous() and t.data_ptr() % 16 == 0:
            return t
        buf = self.staging.get((idx, j))
        if buf is None:
            buf = self.staging[(idx, j)] = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        buf.copy_(t)
        return buf

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"{g.name}: expected {len(g.inputs)} inputs, got {len(inputs)}")
        env: dict[str, torch.Tensor] = {}
        for v, t in zip(g.inputs, inputs):
            want = TORCH_DTYPES[v.type.dtype]
            if tuple(t.shape) != v.type.shape or t.dtype != want or t.device != self.device:
                raise TypeError(f"{g.name}: input %{v.name} is {t.dtype}{list(t.shape)} on {t.device}; expected "
                                f"{want}{list(v.type.shape)} on {self.device}")
            env[v.name] = t
        stream = self.kernels.stream(self.device)
        for idx, n in enumerate(g.nodes):
            args = [env[a] for a in n.args]
            if n.op in _VIEWS:
                env[n.out.name] = view(n, args[0])
            elif n.op == "const":
                env[n.out.name] = self.constants[n.out.name]
            elif n.op != "customized":
                out = self.buffers[n.out.name]
                run_library(n, args, out)
                env[n.out.name] = out
            else:
                args = [self._operand(idx, j, a) for j, a in enumerate(args)]
                for i in self.specs_of.get(idx, []):
                    bufs = []
                    for b in self.module.kernels[i].params:
                        if b.role == "in":
                            bufs.append(args[b.index])
                        elif b.role == "out":
                            bufs.append(self.buffers[n.outs[b.index].name])
                        else:
                            bufs.append(self.workspaces[(idx, b.index)])
                    self.kernels.launch(i, bufs, stream)
                env.update((v.name, self.buffers[v.name]) for v in n.outs)
        return [env[o] for o in g.outputs]


def cuda_runner(ugraph: KernelGraph, device: str | torch.device = "cuda", arch: str = "sm_90a") -> CudaGraphRunner:
    """Render, compile (NVRTC) and load ``ugraph``."""
    module = render_cuda(ugraph)
    return CudaGraphRunner(ugraph, compile_cuda(module, arch), device, module)


__all__ = ["CudaGraphRunner", "CudaLaunchError", "DriverKernels", "cuda_runner"]
