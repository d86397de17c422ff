import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def attn_in_1_m2_fused_k0(a0_ptr, a1_ptr, a2_ptr, o0_ptr, a0_ptr_b, a1_ptr_b, a2_ptr_b, o0_ptr_b):
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    if tl.program_id(2) == 1:  # the second instance: its own pointers
        a0_ptr = a0_ptr_b
        a1_ptr = a1_ptr_b
        a2_ptr = a2_ptr_b
        o0_ptr = o0_ptr_b
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    v0_i0 = tl.load(a0_ptr + (tl.arange(0, 4096)))
    v1_i1 = tl.load(a1_ptr + (pid0 * 1 + tl.arange(0, 1)[:, None]) * 4096 + (tl.arange(0, 4096)[None, :]))
    v2_i2 = tl.load(a2_ptr + (pid1 * 1 + tl.arange(0, 1)[:, None]) * 4096 + (tl.arange(0, 4096)[None, :]))
    v3_v0 = tl.full([], 4096.0, tl.float32)
    v4_v1 = tl.full([], 1e-05, tl.float32)
    v5_v2 = (v2_i2.to(tl.float32) * v2_i2.to(tl.float32))
    v6_v3 = tl.sum(v5_v2, axis=1, keep_dims=True)
    v7_v5 = v6_v3
    v8_v6 = (v0_i0.to(tl.float32) * v2_i2.to(tl.float32))
    v9_v7 = (v7_v5 / v3_v0)
    v10_v8 = tl.sum((v8_v6.to(tl.bfloat16).to(tl.float32)) * (v1_i1.to(tl.float32)), axis=1, keep_dims=True)
    v11_v9 = v10_v8
    v12_v10 = (v4_v1 + v9_v7)
    v13_v11 = tl.rsqrt(v12_v10)
    v14_v12 = (v11_v9 * v13_v11)
    v15_v13 = v14_v12.to(tl.bfloat16).to(tl.float32)
    tl.store(o0_ptr + (pid1 * 1 + tl.arange(0, 1)[:, None]) * 1024 + (pid0 * 1 + tl.arange(0, 1)[None, :]), v15_v13.to(o0_ptr.dtype.element_ty))

def launch_attn_in_1_m2_fused_k0(a0: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, o0: torch.Tensor, a0_b: torch.Tensor, a1_b: torch.Tensor, a2_b: torch.Tensor, o0_b: torch.Tensor, num_warps: int, num_stages: int) -> None:
    wrap_triton(attn_in_1_m2_fused_k0)[(1024, 2, 2)](a0, a1, a2, o0, a0_b, a1_b, a2_b, o0_b, num_warps=num_warps, num_stages=num_stages)

