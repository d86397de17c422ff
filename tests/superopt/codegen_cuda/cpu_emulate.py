"""Run generated CUDA C++ on the CPU: g++ with a shim, one OS thread per CUDA thread.

The CUDA renderer's output is checked numerically in CI (no GPU) by compiling the kernels as
C++20: ``__syncthreads`` is a ``std::barrier`` over the block's threads, shared memory a per-block
buffer, ``atomicAdd`` a compare-and-swap, ``cp.async`` a 16-byte copy, fp16 ``_Float16`` and
bf16 a round-to-nearest-even bit shim. Threads really run concurrently, so a missing barrier
shows up as a wrong or changing result. The PTX helpers of the prelude are replaced by C++ ones.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile

import numpy as np

from superopt.codegen.cuda import CudaModule
from superopt.codegen.cuda_prelude import C_TYPES, PRELUDE

SHIM = r"""
#include <barrier>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <thread>
#include <vector>
struct dim3_ { unsigned x = 0, y = 0, z = 0; };
thread_local dim3_ threadIdx, blockIdx;
thread_local std::barrier<>* emu_bar;
thread_local std::barrier<>* emu_warp_bar;   // the 32 threads of this thread's warp
thread_local float* emu_warp_buf;            // 32 exchange slots of this warp
thread_local unsigned char* emu_smem;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
#define __align__(n)
#define __shared__
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int s) {
  const int lane = threadIdx.x & 31;
  emu_warp_buf[lane] = v;
  emu_warp_bar->arrive_and_wait();
  const float r = emu_warp_buf[lane ^ s];
  emu_warp_bar->arrive_and_wait();
  return r;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { return __int_as_float(x); }
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
struct __half { _Float16 v; };
struct __nv_bfloat16 { uint16_t v; };
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
inline float __bfloat162float(__nv_bfloat16 h) { unsigned u = (unsigned)h.v << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline float atomicAdd(float* p, float v) {
  float old, want;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do { want = old + v; } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
__device__ __forceinline__ float ld_f(float x) { return x; }
__device__ __forceinline__ float ld_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float ld_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> T st_f(float x);
template <> float st_f<float>(float x) { return x; }
template <> __half st_f<__half>(float x) { return __float2half_rn(x); }
template <> __nv_bfloat16 st_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
inline float rnd_float32(float x) { return x; }
inline float rnd_float16(float x) { return __half2float(__float2half_rn(x)); }
inline float rnd_bfloat16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
inline float op_exp(float x) { return std::exp(x); }
inline float op_square(float x) { return x * x; }
inline float op_neg(float x) { return -x; }
inline float op_sqrt(float x) { return std::sqrt(x); }
inline float op_rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float op_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float op_silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float op_tanh(float x) { return std::tanh(x); }
inline float op_gelu_tanh(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))); }
inline float op_gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f)); }
inline float op_erf(float x) { return std::erf(x); }
inline float op_relu(float x) { return std::fmax(x, 0.0f); }
inline float op_add(float a, float b) { return a + b; }
inline float op_sub(float a, float b) { return a - b; }
inline float op_mul(float a, float b) { return a * b; }
inline float op_div(float a, float b) { return a / b; }
inline float op_max(float a, float b) { return std::fmax(a, b); }
template <typename T> inline void unpack(const uint4& v, float* f, const T*) {
  const T* e = reinterpret_cast<const T*>(&v);
  for (unsigned i = 0; i < 16 / sizeof(T); ++i) f[i] = ld_f(e[i]);
}
inline uint4 ldg_stream(const void* p) {
  if ((uintptr_t)p % 16) __builtin_trap();  // the GPU faults on a misaligned vector load
  uint4 v; std::memcpy(&v, p, 16); return v;
}
inline void cp_async16(void* s, const void* g) {
  if ((uintptr_t)s % 16 || (uintptr_t)g % 16) __builtin_trap();
  std::memcpy(s, g, 16);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
template <typename T> inline void finish_f32(const float* ws, T* out, long long n) {
  long long i = (long long)blockIdx.x * 256 + threadIdx.x;
  if (i < n) out[i] = st_f<T>(ws[i]);
}
template <typename F> void emu_launch(F body, int gx, int gy, int gz, int nt, size_t smem_bytes) {
  std::vector<unsigned char> smem((smem_bytes + 16) * 1);
  unsigned char* base = reinterpret_cast<unsigned char*>(((uintptr_t)smem.data() + 15) & ~(uintptr_t)15);
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {
    std::fill(smem.begin(), smem.end(), (unsigned char)0xff);  // poison: NaN floats
    std::barrier<> bar(nt);
    std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
    for (int w = 0; w < nt / 32; ++w) warp_bars.emplace_back(new std::barrier<>(32));
    std::vector<float> warp_buf(nt);
    std::vector<std::thread> threads;
    for (int t = 0; t < nt; ++t) threads.emplace_back([&, t] {
      threadIdx.x = t; blockIdx.x = x; blockIdx.y = y; blockIdx.z = z; emu_bar = &bar; emu_smem = base;
      emu_warp_bar = warp_bars[t / 32].get(); emu_warp_buf = warp_buf.data() + (t / 32) * 32;
      body();
    });
    for (auto& th : threads) th.join();
  }
}
"""

NP_STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float64 → the bits the kernel reads (bf16: round to nearest even, kept as uint16)."""
    if dtype != "bfloat16":
        return np.ascontiguousarray(x, dtype=NP_STORAGE[dtype])
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype != "bfloat16":
        return x.astype(np.float64)
    return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _launcher(k, ns: str) -> str:
    args = [f"({C_TYPES[b.dtype]}*)a[{i}]" for i, b in enumerate(k.params)]
    args += [f"(long long)(intptr_t)a[{len(k.params) + j}]" for j in range(len(k.scalars))]
    return (f'extern "C" void emu_{ns}_{k.name}(void** a) {{ emu_launch([&] {{ {ns}::{k.name}({", ".join(args)}); }}, '
            f"{k.grid[0]}, {k.grid[1]}, {k.grid[2]}, {k.block[0]}, {k.smem_bytes}); }}")


def build(modules: list[CudaModule], workdir: str | None = None) -> ctypes.CDLL:
    """Compile modules for the CPU emulator in one g++ run (module i in namespace ``m{i}``, its
    kernels exported as ``emu_m{i}_<name>``); cached by source hash."""
    src = SHIM
    for i, module in enumerate(modules):
        body = module.source.split(PRELUDE, 1)[1]
        body = body.replace('extern "C" __global__', "__global__").replace(
            "extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = emu_smem;")
        src += f"namespace m{i} {{\n{body}\n}}\n"
        for name in dict.fromkeys(k.name for k in module.kernels):
            src += _launcher(next(k for k in module.kernels if k.name == name), f"m{i}") + "\n"
    d = workdir or os.path.join(tempfile.gettempdir(), "superopt_cuda_emu")
    os.makedirs(d, exist_ok=True)
    key = hashlib.sha256(src.encode()).hexdigest()[:16]
    so = os.path.join(d, f"k{key}.so")
    if not os.path.exists(so):
        cpp = os.path.join(d, f"k{key}.cpp")
        with open(cpp, "w") as f:
            f.write(src)
        tmp = f"{so}.{os.getpid()}.tmp"
        r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-o", tmp, cpp],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ rejected the emulated kernels ({cpp}):\n{r.stderr[-3000:]}")
        os.replace(tmp, so)
    return ctypes.CDLL(so)


def run(module: CudaModule, ugraph, inputs: list[np.ndarray], lib: ctypes.CDLL | None = None,
        ns: str = "m0") -> list[np.ndarray]:
    """Evaluate ``ugraph`` with its customized ops run by the emulated kernels (float64 results).

    Library ops run in float64 numpy and are rounded to their dtype, as the GPU runtime's torch
    ops would produce them. Outputs and workspaces start poisoned (NaN) unless zeroed by spec.
    """
    from superopt.interp import NumpyDomain
    from superopt.interp.evaluate import apply_op

    lib = lib or build([module])
    env = {v.name: to_storage(x, v.type.dtype) for v, x in zip(ugraph.inputs, inputs)}
    by_node: dict[int, list] = {}
    for k in module.kernels:
        by_node.setdefault(k.node, []).append(k)
    for idx, n in enumerate(ugraph.nodes):
        if n.op != "customized":
            args = [from_storage(env[a], ugraph.type_of(a).dtype) for a in n.args]
            env[n.out.name] = to_storage(np.asarray(apply_op(n, args, NumpyDomain()), dtype=np.float64),
                                         n.out.type.dtype)
            continue
        outs = [np.full(v.type.numel, np.nan, NP_STORAGE[v.type.dtype]) if v.type.dtype != "bfloat16"
                else np.full(v.type.numel, 0x7FC0, np.uint16) for v in n.outs]
        ws: dict[int, np.ndarray] = {}
        for k in by_node[idx]:
            bufs = []
            for b in k.params:
                if b.role == "in":
                    bufs.append(np.ascontiguousarray(env[n.args[b.index]]))
                elif b.role == "out":
                    bufs.append(outs[b.index])
                else:
                    bufs.append(ws.setdefault(b.index, np.full(b.numel, np.nan, np.float32)))
            for z in k.zero:
                bufs[z][...] = 0
            ptrs = [b.ctypes.data for b in bufs] + list(k.scalars)
            getattr(lib, f"emu_{ns}_{k.name}")((ctypes.c_void_p * len(ptrs))(*ptrs))
        for v, o in zip(n.outs, outs):
            env[v.name] = o.reshape(v.type.shape)
    return [from_storage(env[o], ugraph.type_of(o).dtype).reshape(ugraph.type_of(o).shape) for o in ugraph.outputs]
