import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def mlp_out_m16_fused_k0(a0_ptr, a1_ptr, o0_ptr):
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    v0_i0 = tl.load(a0_ptr + (pid0 * 4 + tl.arange(0, 4)[:, None]) * 1536 + (tl.arange(0, 2048)[None, :]), mask=(tl.arange(0, 2048)[None, :] < 1536), other=0.0)
    v1_i1 = tl.load(a1_ptr + (pid1 * 1 + tl.arange(0, 1)[:, None]) * 1536 + (tl.arange(0, 2048)[None, :]), mask=(tl.arange(0, 2048)[None, :] < 1536), other=0.0)
    v2_v1 = tl.sum((tl.where((tl.arange(0, 2048)[None, :] < 1536), v1_i1.to(tl.float32), 0.0)) * (tl.where((tl.arange(0, 2048)[None, :] < 1536), v0_i0.to(tl.float32), 0.0)), axis=1)[None, :]
    tl.store(o0_ptr + (pid1 * 1 + tl.arange(0, 1)[:, None]) * 576 + (pid0 * 4 + tl.arange(0, 4)[None, :]), v2_v1.to(o0_ptr.dtype.element_ty))

def launch_mlp_out_m16_fused_k0(a0: torch.Tensor, a1: torch.Tensor, o0: torch.Tensor, num_warps: int, num_stages: int) -> None:
    wrap_triton(mlp_out_m16_fused_k0)[(144, 16, 1)](a0, a1, o0, num_warps=num_warps, num_stages=num_stages)

