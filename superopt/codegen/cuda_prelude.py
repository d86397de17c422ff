"""The CUDA C++ text every generated module starts with: dtype loads/stores and op functions.

Block values are computed in float32 registers whatever their declared dtype (accumulators
included), so each dtype needs only a load (to float) and a store (from float, round to nearest).
"""
from __future__ import annotations

# C type of a device tensor element per IR dtype (float64 is not rendered: see cuda_plan).
C_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

PRELUDE = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>

// loads: element -> float32
__device__ __forceinline__ float ld_f(float x) { return x; }
__device__ __forceinline__ float ld_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float ld_f(__nv_bfloat16 x) { return __bfloat162float(x); }
// stores: float32 -> element, round to nearest even
template <typename T> __device__ __forceinline__ T st_f(float x);
template <> __device__ __forceinline__ float st_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half st_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 st_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// cast nodes: round through the target dtype, keep computing in float32
__device__ __forceinline__ float rnd_float32(float x) { return x; }
__device__ __forceinline__ float rnd_float16(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ float rnd_bfloat16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// elementwise ops (float32)
__device__ __forceinline__ float op_exp(float x) { return expf(x); }
__device__ __forceinline__ float op_square(float x) { return x * x; }
__device__ __forceinline__ float op_neg(float x) { return -x; }
__device__ __forceinline__ float op_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float op_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ float op_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float op_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float op_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float op_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
// activations (issue 27, search-ops)
__device__ __forceinline__ float op_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
__device__ __forceinline__ float op_erf(float x) { return erff(x); }
__device__ __forceinline__ float op_relu(float x) { return fmaxf(x, 0.0f); }
__device__ __forceinline__ float op_add(float a, float b) { return a + b; }
__device__ __forceinline__ float op_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float op_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float op_div(float a, float b) { return a / b; }
__device__ __forceinline__ float op_max(float a, float b) { return fmaxf(a, b); }

// 16-byte vectors: one uint4 holds 8 halves / 8 bfloat16 / 4 floats
__device__ __forceinline__ void unpack(const uint4& v, float* f, const __half*) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) { float2 p = __half22float2(h[i]); f[2 * i] = p.x; f[2 * i + 1] = p.y; }
}
__device__ __forceinline__ void unpack(const uint4& v, float* f, const __nv_bfloat16*) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) { float2 p = __bfloat1622float2(h[i]); f[2 * i] = p.x; f[2 * i + 1] = p.y; }
}
__device__ __forceinline__ void unpack(const uint4& v, float* f, const float*) {
  f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
  f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
}
// read-only 16-byte global load that skips L1 allocation: weights are read once
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// cp.async: 16 bytes global -> shared without passing through registers (sm_80+)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// cross-block reduction combine: float32 workspace -> output dtype
template <typename T>
__device__ __forceinline__ void finish_f32(const float* __restrict__ ws, T* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = st_f<T>(ws[i]);
}
"""
