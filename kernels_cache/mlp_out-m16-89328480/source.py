import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def mlp_out_m16_fused_k0(a0_ptr, a1_ptr, o0_ptr):
    pid0 = tl.program_id(0)
    v0_v2 = tl.full([16, 16], 0.0, tl.float32)
    for i in range(32):
        v1_i0 = tl.load(a0_ptr + (pid0 * 16 + tl.arange(0, 16)[:, None]) * 8192 + (i * 256 + tl.arange(0, 256)[None, :]))
        v2_i1 = tl.load(a1_ptr + (tl.arange(0, 16)[:, None]) * 8192 + (i * 256 + tl.arange(0, 256)[None, :]))
        v3_v0 = tl.trans(v1_i0.to(tl.float32))
        v4_v1 = tl.dot(v2_i1, v3_v0.to(tl.bfloat16), out_dtype=tl.float32)
        v0_v2 = v0_v2 + v4_v1
    tl.store(o0_ptr + (tl.arange(0, 16)[:, None]) * 2048 + (pid0 * 16 + tl.arange(0, 16)[None, :]), v0_v2.to(o0_ptr.dtype.element_ty))

def launch_mlp_out_m16_fused_k0(a0: torch.Tensor, a1: torch.Tensor, o0: torch.Tensor, num_warps: int, num_stages: int) -> None:
    wrap_triton(mlp_out_m16_fused_k0)[(128, 1, 1)](a0, a1, o0, num_warps=num_warps, num_stages=num_stages)

