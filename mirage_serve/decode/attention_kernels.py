"""Triton kernels of one decode-attention step over a static KV cache (one new token per row).

Three launches per layer replace HF's ~25 (RoPE as five elementwise ops each for q and k, the
cache's index_copy, a mask, repeat_kv copies on older transformers, SDPA, a transpose copy):

1. ``_rope_write``: RoPE (HF's rotate-half convention, each product rounded to the model dtype as
   HF's eager ops round it) on q into a scratch buffer, and on k into the cache; v copied into the
   cache. The slot is read from device memory (``pos_ptr``), so no step needs a host sync.
2. ``_attend_split``: flash-decoding. Program (row, kv head, split) runs the whole GQA group of
   that kv head against one slice of the cache — K and V are read in place, once per group — with
   an online softmax; splits past the current length return at once. Partial outputs in float32.
3. ``_combine``: the splits' partial softmaxes merged into the attention output, in the layout
   o_proj reads; its first program also advances the cache's device-side length, if it has one.

The number of splits depends only on the cache's capacity and the launch shape, never on the
current length, so one CUDA graph serves every step.
"""
from __future__ import annotations

import triton
import triton.language as tl

BLOCK_N = 64  # cache positions per loop iteration


@triton.jit
def _rope_write(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qo_ptr, kc_ptr, vc_ptr, pos_ptr,
                q_sb, k_sb, v_sb, cs_sb, qo_sb,
                c_sb, c_sh, c_sn,
                HQ: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)          # 0..HQ-1: q heads; HQ..: kv heads
    i = tl.arange(0, BLOCK_H)
    ok = i < HALF
    c1 = tl.load(cos_ptr + row * cs_sb + i, mask=ok, other=0.0)
    c2 = tl.load(cos_ptr + row * cs_sb + HALF + i, mask=ok, other=0.0)
    s1 = tl.load(sin_ptr + row * cs_sb + i, mask=ok, other=0.0)
    s2 = tl.load(sin_ptr + row * cs_sb + HALF + i, mask=ok, other=0.0)
    dt = qo_ptr.dtype.element_ty
    if head < HQ:
        src = q_ptr + row * q_sb + head * 2 * HALF
        dst = qo_ptr + row * qo_sb + head * 2 * HALF
    else:
        kv = head - HQ
        pos = tl.load(pos_ptr)
        src = k_ptr + row * k_sb + kv * 2 * HALF
        dst = kc_ptr + row * c_sb + kv * c_sh + pos * c_sn
        vsrc = v_ptr + row * v_sb + kv * 2 * HALF
        vdst = vc_ptr + row * c_sb + kv * c_sh + pos * c_sn
        tl.store(vdst + i, tl.load(vsrc + i, mask=ok), mask=ok)
        tl.store(vdst + HALF + i, tl.load(vsrc + HALF + i, mask=ok), mask=ok)
    x1 = tl.load(src + i, mask=ok, other=0.0)
    x2 = tl.load(src + HALF + i, mask=ok, other=0.0)
    # x·cos + rotate_half(x)·sin with rotate_half(x) = (-x2, x1); every product and the sum
    # rounded to the model dtype, as HF's bf16/fp16 elementwise ops round them
    a1 = (x1.to(tl.float32) * c1.to(tl.float32)).to(dt)
    a2 = (x2.to(tl.float32) * c2.to(tl.float32)).to(dt)
    b1 = (-x2.to(tl.float32) * s1.to(tl.float32)).to(dt)
    b2 = (x1.to(tl.float32) * s2.to(tl.float32)).to(dt)
    tl.store(dst + i, (a1.to(tl.float32) + b1.to(tl.float32)).to(dt), mask=ok)
    tl.store(dst + HALF + i, (a2.to(tl.float32) + b2.to(tl.float32)).to(dt), mask=ok)


@triton.jit
def _attend_split(q_ptr, kc_ptr, vc_ptr, pos_ptr, mask_ptr, o_ptr, m_ptr, l_ptr,
                  q_sb, c_sb, c_sh, c_sn, mk_sb, mk_sn, o_sb, o_sh, o_ss, ml_sb, ml_sh,
                  scale, chunk,
                  HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASK_KIND: tl.constexpr):
    """MASK_KIND: 0 none (attend to every written slot), 1 boolean (True = attend), 2 additive."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    row = pid // HKV
    kv = pid % HKV
    length = tl.load(pos_ptr) + 1          # slots written, the new token included
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    g_ok = g < GROUP
    d_ok = d < D
    heads = kv * GROUP + g
    q = tl.load(q_ptr + row * q_sb + heads[:, None] * D + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    base = row * c_sb + kv * c_sh
    for s0 in range(start, end, BLOCK_N):
        cols = s0 + n
        ok = cols < end
        kt = tl.load(kc_ptr + base + cols[None, :] * c_sn + d[:, None],
                     mask=ok[None, :] & d_ok[:, None], other=0.0)           # [BLOCK_D, BLOCK_N]
        s = tl.dot(q, kt, input_precision="ieee") * scale                     # [BLOCK_G, BLOCK_N]
        if MASK_KIND == 1:
            keep = tl.load(mask_ptr + row * mk_sb + cols * mk_sn, mask=ok, other=0)
            ok = ok & (keep != 0)
        if MASK_KIND == 2:
            s += tl.load(mask_ptr + row * mk_sb + cols * mk_sn, mask=ok, other=0.0).to(tl.float32)[None, :]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # a fully masked tile: no NaN
        p = tl.exp(s - m_use[:, None])
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + base + cols[:, None] * c_sn + d[None, :],
                    mask=ok[:, None] & d_ok[None, :], other=0.0)            # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    o_off = row * o_sb + heads[:, None] * o_sh + split * o_ss + d[None, :]
    tl.store(o_ptr + o_off, acc, mask=g_ok[:, None] & d_ok[None, :])
    ml_off = row * ml_sb + heads * ml_sh + split
    tl.store(m_ptr + ml_off, m_i, mask=g_ok)
    tl.store(l_ptr + ml_off, l_i, mask=g_ok)


@triton.jit
def _combine(o_ptr, m_ptr, l_ptr, out_ptr, len_ptr,
             o_sb, o_sh, o_ss, ml_sb, ml_sh, out_sb,
             HQ: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
             BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ADVANCE: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // HQ
    head = pid % HQ
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < SPLITS
    ml = row * ml_sb + head * ml_sh + s
    m = tl.load(m_ptr + ml, mask=s_ok, other=float("-inf"))
    l = tl.load(l_ptr + ml, mask=s_ok, other=0.0)
    m_all = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_all))
    o = tl.load(o_ptr + row * o_sb + head * o_sh + s[:, None] * o_ss + d[None, :],
                mask=s_ok[:, None] & (d[None, :] < D), other=0.0)
    res = tl.sum(o * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(out_ptr + row * out_sb + head * D + d, res.to(out_ptr.dtype.element_ty), mask=d < D)
    if ADVANCE:
        if pid == 0:  # the cache's length counter: every reader of it (kernels 1, 2) has finished
            tl.store(len_ptr, tl.load(len_ptr) + 1)
