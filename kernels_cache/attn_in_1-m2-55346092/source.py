import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def attn_in_1_m2_fused_k0(a0_ptr, a1_ptr, a2_ptr, a3_ptr, o0_ptr):
    pid0 = tl.program_id(0)
    v0_i2 = tl.load(a2_ptr + (pid0 * 1 + tl.arange(0, 1)))
    v1_v0 = tl.full([], 3584.0, tl.float32)
    v2_v1 = tl.full([], 1e-06, tl.float32)
    v3_v5 = v0_i2.to(tl.float32)
    v4_v10 = tl.full([2, 1], 0.0, tl.float32)
    v5_v11_el = tl.full([2, 512], 0.0, tl.float32)
    for i in range(7):
        v6_i0 = tl.load(a0_ptr + (i * 512 + tl.arange(0, 512)))
        v7_i1 = tl.load(a1_ptr + (pid0 * 1 + tl.arange(0, 1)[:, None]) * 3584 + (i * 512 + tl.arange(0, 512)[None, :]))
        v8_i3 = tl.load(a3_ptr + (tl.arange(0, 2)[:, None]) * 3584 + (i * 512 + tl.arange(0, 512)[None, :]))
        v9_v2 = (v8_i3.to(tl.float32) * v8_i3.to(tl.float32))
        v10_v3 = tl.sum(v9_v2, axis=1, keep_dims=True)
        v11_v6 = v10_v3
        v12_v7 = (v6_i0.to(tl.float32) * v8_i3.to(tl.float32))
        v13_v8 = (v11_v6 / v1_v0)
        v4_v10 = v4_v10 + v13_v8
        v5_v11_el = v5_v11_el + (v12_v7.to(tl.bfloat16).to(tl.float32)) * (v7_i1.to(tl.float32))
    v5_v11 = tl.sum(v5_v11_el, axis=1, keep_dims=True)
    v14_v12 = v5_v11
    v15_v13 = (v2_v1 + v4_v10)
    v16_v14 = tl.rsqrt(v15_v13)
    v17_v15 = (v14_v12 * v16_v14)
    v18_v16 = (v3_v5 + v17_v15)
    v19_v17 = v18_v16.to(tl.bfloat16).to(tl.float32)
    tl.store(o0_ptr + (tl.arange(0, 2)[:, None]) * 512 + (pid0 * 1 + tl.arange(0, 1)[None, :]), v19_v17.to(o0_ptr.dtype.element_ty))

def launch_attn_in_1_m2_fused_k0(a0: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, a3: torch.Tensor, o0: torch.Tensor, num_warps: int, num_stages: int) -> None:
    wrap_triton(attn_in_1_m2_fused_k0)[(512, 1, 1)](a0, a1, a2, a3, o0, num_warps=num_warps, num_stages=num_stages)

