import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def mlp_out_m1_fused_k0(a0_ptr, a1_ptr, a2_ptr, o0_ptr):
    pid0 = tl.program_id(0)
    v0_i2 = tl.load(a2_ptr + (tl.arange(0, 1)[:, None]) * 576 + (pid0 * 1 + tl.arange(0, 1)[None, :]))
    v1_v2_el = tl.full([1, 512], 0.0, tl.float32)
    v2_i0_next = tl.load(a0_ptr + (pid0 * 1 + tl.arange(0, 1)[:, None]) * 1536 + (0 * 512 + tl.arange(0, 512)[None, :]))
    v3_i1_next = tl.load(a1_ptr + (tl.arange(0, 1)[:, None]) * 1536 + (0 * 512 + tl.arange(0, 512)[None, :]))
    for i in range(3):
        v2_i0 = v2_i0_next
        v2_i0_next = tl.load(a0_ptr + (pid0 * 1 + tl.arange(0, 1)[:, None]) * 1536 + (((i + 1) % 3) * 512 + tl.arange(0, 512)[None, :]))
        v3_i1 = v3_i1_next
        v3_i1_next = tl.load(a1_ptr + (tl.arange(0, 1)[:, None]) * 1536 + (((i + 1) % 3) * 512 + tl.arange(0, 512)[None, :]))
        v1_v2_el = v1_v2_el + (v3_i1.to(tl.float32)) * (v2_i0.to(tl.float32))
    v1_v2 = tl.sum(v1_v2_el, axis=1, keep_dims=True)
    v4_v3 = (v0_i2.to(tl.float32) + v1_v2)
    tl.store(o0_ptr + (tl.arange(0, 1)[:, None]) * 576 + (pid0 * 1 + tl.arange(0, 1)[None, :]), v4_v3.to(o0_ptr.dtype.element_ty))

def launch_mlp_out_m1_fused_k0(a0: torch.Tensor, a1: torch.Tensor, a2: torch.Tensor, o0: torch.Tensor, num_warps: int, num_stages: int) -> None:
    wrap_triton(mlp_out_m1_fused_k0)[(576, 1, 1)](a0, a1, a2, o0, num_warps=num_warps, num_stages=num_stages)

