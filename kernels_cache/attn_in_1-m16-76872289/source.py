import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def attn_in_1_m16_fused_k0(a0_ptr, a1_ptr, a2_ptr, a3_ptr, o0_ptr, o1_ptr):
    pid0 = tl.program_id(0)
    v0_v0 = tl.full([], 576.0, tl.float32)
    v1_v1 = tl.full([], 1e-05, tl.float32)
    v2_v11 = tl.full([16, 1], 0.0, tl.float32)
    v3_v12 = tl.full([16, 256], 0.0, tl.float32)
    v4_v13 = tl.full([16, 256], 0.0, tl.float32)
    for i in range(9):
        v5_i0 = tl.load(a0_ptr + (i * 64 + tl.arange(0, 64)))
        v6_i1 = tl.load(a1_ptr + (tl.arange(0, 256)[:, None]) * 576 + (i * 64 + tl.arange(0, 64)[None, :]), mask=(tl.arange(0, 256)[:, None] < 192), other=0.0)
        v7_i2 = tl.load(a2_ptr + (tl.arange(0, 256)[:, None]) * 576 + (i * 64 + tl.arange(0, 64)[None, :]), mask=(tl.arange(0, 256)[:, None] < 192), other=0.0)
        v8_i3 = tl.load(a3_ptr + (pid0 * 2 + tl.arange(0, 16)[:, None]) * 576 + (i * 64 + tl.arange(0, 64)[None, :]), mask=(tl.arange(0, 16)[:, None] < 2), other=0.0)
        v9_v2 = (v8_i3.to(tl.float32) * v8_i3.to(tl.float32))
        v10_v3 = tl.sum(v9_v2, axis=1, keep_dims=True)
        v11_v4 = tl.trans(v6_i1.to(tl.float32))
        v12_v5 = tl.trans(v7_i2.to(tl.float32))
        v13_v6 = v10_v3
        v14_v7 = (v5_i0.to(tl.float32) * v8_i3.to(tl.float32))
        v15_v8 = (v13_v6 / v0_v0)
        v16_v9 = tl.dot(v14_v7.to(tl.bfloat16), v11_v4.to(tl.bfloat16), out_dtype=tl.float32)
        v17_v10 = tl.dot(v14_v7.to(tl.bfloat16), v12_v5.to(tl.bfloat16), out_dtype=tl.float32)
        v2_v11 = v2_v11 + v15_v8
        v3_v12 = v3_v12 + v16_v9
        v4_v13 = v4_v13 + v17_v10
    v18_v14 = v3_v12
    v19_v15 = v4_v13
    v20_v16 = (v1_v1 + v2_v11)
    v21_v17 = tl.rsqrt(v20_v16)
    v22_v18 = (v18_v14 * v21_v17)
    v23_v19 = (v19_v15 * v21_v17)
    v24_v20 = v22_v18.to(tl.bfloat16).to(tl.float32)
    v25_v21 = v23_v19.to(tl.bfloat16).to(tl.float32)
    tl.store(o0_ptr + (pid0 * 2 + tl.arange(0, 16)[:, None]) * 192 + (tl.arange(0, 256)[None, :]), v24_v20.to(o0_ptr.dtype.element_ty), mask=(tl.arange(0, 16)[:, None] < 2) & (tl.arange(0, 256)[None, :] < 192))
    tl.store(o1_ptr + (pid0 * 2 + tl.arange(0, 16)[:, None]) * 192 + (tl.arange(0, 256)[None, :]), v25_v21.to(o1_ptr.dtype.element_ty), mask=(tl.arange(0, 16)[:, None] < 2) & (tl.arange(0, 256)[None, :] < 192))

def launch_attn_in_1_m16_fused_k0(a0: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, a3: torch.Tensor, o0: torch.Tensor, o1: torch.Tensor, num_warps: int, num_stages: int) -> None:
    wrap_triton(attn_in_1_m16_fused_k0)[(8, 1, 1)](a0, a1, a2, a3, o0, o1, num_warps=num_warps, num_stages=num_stages)

