"""Launch the two decode-attention kernels (``attention_kernels``) for one layer and one step.

Shapes (b rows, Hq query heads, Hkv kv heads, d head dim, L cache capacity):
q, k, v: [b, Hq·d], [b, Hkv·d], [b, Hkv·d] (row stride free, unit stride inside a row);
cos, sin: [b or 1, d] (q's dtype or float32); keys, values: the cache layer's [b, Hkv, L, d]; pos: int64 device scalar
(the slot the new token is written to); mask: None or [b or 1, L] (bool: True attends; float:
added to the scores). Returns the attention output [b, Hq·d] in q's dtype.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from superopt.runtime.compiled import mark
from superopt.runtime.grid_dependency import applies, launch_options

from .attention_kernels import BLOCK_N, _attend_split, _combine


@dataclass(frozen=True)
class LaunchPlan:
    """How ``_attend_split`` is cut and launched (benchmarks/sweep_attention.py measures others)."""
    waves: int = 2          # split the cache until programs fill this many waves of the GPU's SMs
    block_n: int = BLOCK_N  # cache positions per loop iteration
    num_warps: int = 4
    num_stages: int = 3     # Triton's default on Hopper
    one_tile_splits: int = 16  # up to this many splits, one tile a split where 2 × waves waves hold them (0: never)
    combine_warps: int = 1  # warps of a ``_combine`` program, which reads every split's partial head vector


DEFAULT_PLAN = LaunchPlan()


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # Triton's CPU interpreter: a few splits still exercise the combine
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_plan(rows: int, kv_heads: int, capacity: int, sms: int, plan: LaunchPlan = DEFAULT_PLAN) -> tuple[int, int]:
    """(splits, positions per split): enough programs to fill ``plan.waves`` waves of the GPU, each split a
    whole number of tiles; one tile a split where that is at most ``plan.one_tile_splits`` splits and twice
    the waves (a one-tile slice is loaded before the dependent-launch wait, ``attention_kernels``: at 8 rows
    and 6 tiles that was 4–9% faster alone and 1.3% a step end to end; at 64 tiles of 128-wide heads the
    combine's extra splits made it 13% slower: benchmarks/results/floor_h200_2026-11-28_s37/README.md). Depends on
    the capacity, not the current length (graph-stable)."""
    tiles = -(-capacity // plan.block_n)
    if tiles <= plan.one_tile_splits and rows * kv_heads * tiles <= 2 * plan.waves * sms:
        per = 1
    else:
        want = max(1, -(-plan.waves * sms // (rows * kv_heads)))
        per = -(-tiles // min(want, tiles))
    chunk = per * plan.block_n
    return -(-capacity // chunk), chunk


def decode_attention(q, k, v, cos, sin, keys, values, pos, mask, scale: float,
                     advance: torch.Tensor | None = None, qk_norm: tuple | None = None,
                     plan: LaunchPlan = DEFAULT_PLAN, pdl: bool = True, softcap: float | None = None,
                     rotary_dim: int | None = None) -> torch.Tensor:
    """One decode step: RoPE, cache write at ``pos``, attention over slots ``0..pos``.

    ``advance``: a device counter incremented by one after the step (the cache's own length), or
    None when the caller's cache keeps its length elsewhere. ``qk_norm``: (q weight [d], k weight
    [d], eps, form) of a per-head RMSNorm applied to q and k before RoPE, or None; form 1 is HF's
    usual RMSNorm, 2 Gemma-3's (1 + weight, in float32; ``attention_kernels._head``). ``plan``: how the first
    kernel is cut and launched. ``pdl``: with programmatic dependent launch where the GPU has it.
    ``softcap``: Gemma-2's attention logit softcapping (``cap · tanh(s / cap)`` on the scaled scores).
    ``rotary_dim``: RoPE on the first that many dims of each head (cos, sin: [b or 1, rotary_dim]);
    None: the whole head. cos and sin in float32 with q narrower: RoPE is computed in float32 and
    rounded once (HF's OLMo-2), else each product is rounded to q's dtype."""
    mark("decode attention")  # a recorded step ends a persistent segment here (superopt.runtime.persistent)
    b, hkv, cap, d = keys.shape
    hq = q.shape[1] // d
    group = hq // hkv
    dev = q.device
    splits, chunk = split_plan(b, hkv, cap, _sm_count(dev), plan)
    pdl = applies(dev, pdl)  # the kernels wait for their predecessor (superopt.runtime.grid_dependency)
    options = launch_options(pdl)
    o_part = torch.empty(b, hq, splits, d, dtype=torch.float32, device=dev)
    m_part = torch.empty(b, hq, splits, dtype=torch.float32, device=dev)
    l_part = torch.empty_like(m_part)
    if mask is None:
        kind, mask_t, mk_sb, mk_sn = 0, pos, 0, 0
    else:
        kind = 1 if mask.dtype == torch.bool else 2
        mask_t, mk_sb, mk_sn = mask, (mask.stride(0) if mask.shape[0] > 1 else 0), mask.stride(1)
    block_d = max(16, triton.next_power_of_2(d))  # tl.dot needs K ≥ 16
    q_w, k_w, eps, form = qk_norm if qk_norm is not None else (q, k, 0.0, 0)  # weights unread at form 0
    _attend_split[(b * hkv, splits)](
        q, k, v, cos, sin, keys, values, pos, mask_t, o_part, m_part, l_part, q_w, k_w,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0) if cos.shape[0] > 1 else 0,
        keys.stride(0), keys.stride(1), keys.stride(2), mk_sb, mk_sn,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), m_part.stride(0), m_part.stride(1),
        float(scale), float(eps), chunk,
        HKV=hkv, GROUP=group, D=d, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d,
        BLOCK_N=plan.block_n, MASK_KIND=kind, QK_NORM=form, PDL=pdl, ROT=rotary_dim or d,
        SOFTCAP=float(softcap or 0.0), ROPE_WIDE=int(cos.dtype == torch.float32 and q.dtype != torch.float32),
        ONE_TILE=int(chunk == plan.block_n),
        num_warps=plan.num_warps, num_stages=plan.num_stages, **options)

    out = torch.empty(b, hq * d, dtype=q.dtype, device=dev)
    _combine[(b * hq,)](
        o_part, m_part, l_part, out, pos if advance is None else advance,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), m_part.stride(0), m_part.stride(1),
        out.stride(0),
        HQ=hq, D=d, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d,
        ADVANCE=advance is not None, PDL=pdl, num_warps=plan.combine_warps, **options)
    return out
