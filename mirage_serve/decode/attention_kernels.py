"""Triton kernels of one decode-attention step over a static KV cache (one new token per row).

Two launches per layer replace HF's ~25 (RoPE as five elementwise ops each for q and k, the
cache's index_copy, a mask, repeat_kv copies on older transformers, SDPA, a transpose copy):

1. ``_attend_split``: flash-decoding. Program (row, kv head, split) runs the whole GQA group of
   that kv head against one slice of the cache — K and V read in place, once per group — with an
   online softmax. The per-head q/k RMSNorm of models that have one (Qwen3) and RoPE (HF's
   rotate-half convention, each product rounded to the model dtype as HF's eager ops round it) are
   applied to q in registers by every program; the program whose slice holds the new token's slot
   normalises and rotates k, writes k and v to the cache and adds the token to its softmax from
   registers (nothing reads that slot before the write). The slot is read from
   device memory (``pos_ptr``), so no step needs a host sync; splits past it return at once.
   Partial outputs in float32. A program whose slice is one tile loads it before it waits for the
   q / k / v projection to finish (under dependent launch, while the projection still runs).
2. ``_combine``: the splits' partial softmaxes merged into the attention output, in the layout
   o_proj reads; its first program also advances the cache's device-side length, if it has one.

The number of splits depends only on the cache's capacity and the launch shape, never on the
current length, so one CUDA graph serves every step.
"""
from __future__ import annotations

import triton
import triton.language as tl

BLOCK_N = 64  # cache positions per loop iteration


@triton.jit
def _head(ptr, d, partner, ok, w_ptr, eps, D: tl.constexpr, NORM: tl.constexpr, AXIS: tl.constexpr, dt):
    """The head vector(s) at ``ptr`` ([..., D] indexed by ``d``, reduced along ``AXIS``) and their
    rotate-half partners, in float32. NORM: RMS-normalised first, as the module's q_norm / k_norm
    does it in HF, float32 statistics in both forms: 1, HF's usual RMSNorm (the normalised value
    rounded to ``dt``, times the weight, rounded again); 2, Gemma-3's (times 1 + weight in float32,
    rounded once). The partner is a permutation of the same head, so it shares the statistic."""
    x = tl.load(ptr + d, mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(ptr + partner, mask=ok, other=0.0).to(tl.float32)
    if NORM > 0:
        rs = tl.rsqrt(tl.sum(x * x, AXIS, keep_dims=True) / D + eps)
        w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=ok, other=0.0).to(tl.float32)
        if NORM == 1:
            x = (w * (x * rs).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            xp = (wp * (xp * rs).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        else:
            x = (x * rs * (1.0 + w)).to(dt).to(tl.float32)
            xp = (xp * rs * (1.0 + wp)).to(dt).to(tl.float32)
    return x, xp


@triton.jit
def _rope(x, xp, sign, cos, sin, dt, WIDE: tl.constexpr):
    """x·cos + rotate_half(x)·sin, with rotate_half(x)[i] = -x[i + R/2] (i < R/2) or x[i - R/2]
    over the R rotary dims (``xp`` the partner, ``sign`` its sign). WIDE 0: products and sum each
    rounded to ``dt``, as HF's eager ops round them when cos/sin come in the model's dtype; 1: all in
    float32, rounded once, as HF computes it when cos/sin come in float32 (OLMo-2)."""
    if WIDE:
        return (x * cos + sign * xp * sin).to(dt)
    a = (x * cos).to(dt).to(tl.float32)
    b = (sign * xp * sin).to(dt).to(tl.float32)
    return (a + b).to(dt)


@triton.jit
def _softcap(s, cap):
    """``cap · tanh(s / cap)`` (Gemma-2's attention logit softcapping), tanh as ``2·sigmoid(2x) − 1``."""
    return cap * (2.0 * tl.sigmoid(2.0 * s / cap) - 1.0)


@triton.jit
def _cache_tile(kc_ptr, vc_ptr, base, cols, ok, d, d_ok, c_sn):
    """K^T [BLOCK_D, BLOCK_N] and V [BLOCK_N, BLOCK_D] of the cache slots ``cols`` where ``ok`` (else 0).
    V with K, before the scores need K: both tiles in flight at once."""
    kt = tl.load(kc_ptr + base + cols[None, :] * c_sn + d[:, None], mask=ok[None, :] & d_ok[:, None], other=0.0)
    v = tl.load(vc_ptr + base + cols[:, None] * c_sn + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
    return kt, v


@triton.jit
def _attend_tile(q, kt, v, cols, ok, m_i, l_i, acc, scale, mask_ptr, row, mk_sb, mk_sn,
                 SOFTCAP: tl.constexpr, MASK_KIND: tl.constexpr):
    """One tile of the online softmax: (m, l, acc) updated with the slots ``cols`` where ``ok``. Slots < the
    position are all written (finite), so rows the attention mask drops are zero-weighted, never NaN."""
    s = tl.dot(q, kt, input_precision="ieee") * scale                     # [BLOCK_G, BLOCK_N]
    if SOFTCAP > 0:
        s = _softcap(s, SOFTCAP)
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
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _attend_split(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, mask_ptr,
                  o_ptr, m_ptr, l_ptr, qn_ptr, kn_ptr,
                  q_sb, k_sb, v_sb, cs_sb, c_sb, c_sh, c_sn, mk_sb, mk_sn, o_sb, o_sh, o_ss, ml_sb, ml_sh,
                  scale, eps, chunk,
                  HKV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASK_KIND: tl.constexpr, QK_NORM: tl.constexpr, PDL: tl.constexpr, ROT: tl.constexpr,
                  SOFTCAP: tl.constexpr = 0.0, ROPE_WIDE: tl.constexpr = 0, ONE_TILE: tl.constexpr = 0):
    """MASK_KIND: 0 none (attend to every written slot), 1 boolean (True = attend), 2 additive.
    QK_NORM: 0 none, else q and k RMS-normalised per head before RoPE in that form of ``_head``
    (weights ``qn_ptr``, ``kn_ptr``, ``eps``).
    ROT: the rotary dims, the first ROT of each head (D, or fewer: StableLM's partial rotary); the rest
    pass through RoPE unchanged. SOFTCAP: > 0: the scaled scores are soft-capped (``_softcap``) before
    the mask, as HF's Gemma-2 does. ROPE_WIDE: RoPE in float32, rounded once (``_rope``).
    PDL: launched with programmatic dependent launch (superopt.runtime.grid_dependency).
    ONE_TILE: each slice is one tile (``chunk == BLOCK_N``), loaded before the wait (why that is legal: the body)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    row = pid // HKV
    kv = pid % HKV
    start = split * chunk
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    g_ok = g < GROUP
    d_ok = d < D
    base = row * c_sb + kv * c_sh
    # A slice of one tile (ONE_TILE) loads it before the wait for the kernel before this one (the q / k / v
    # projection), so its memory latency overlaps that kernel instead of following it. Legal because no
    # launch of the two before this one writes those slots or the slot counter: every kernel launched with
    # dependent launch waits for its own predecessor before it lets its successor start
    # (superopt.runtime.grid_dependency), so whatever ran two launches back is complete here. The counter
    # (written once a step, by this layer's own attention) is read again after the wait; a caller that
    # advanced it in the very launch before gets the tile loaded again, never a stale one. A longer slice
    # keeps its loop whole, which Triton pipelines: peeled, its second tile waited on the first (H100, session 36).
    cols0 = start + n
    if ONE_TILE:
        early = tl.load(pos_ptr)
        kt0, v0 = _cache_tile(kc_ptr, vc_ptr, base, cols0, cols0 < tl.minimum(start + chunk, early), d, d_ok, c_sn)
    if PDL:  # from here on, the predecessor is complete
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if ONE_TILE:  # the new token's slot (slots < pos are in the cache), read again: not merged with the early read
        pos = tl.load(pos_ptr, volatile=True)
    else:
        pos = tl.load(pos_ptr)
    end = tl.minimum(start + chunk, pos)
    if ONE_TILE:
        if pos != early:
            kt0, v0 = _cache_tile(kc_ptr, vc_ptr, base, cols0, cols0 < end, d, d_ok, c_sn)
    dt = kc_ptr.dtype.element_ty
    half = ROT // 2
    partner = tl.where(d < half, d + half, tl.where(d < ROT, d - half, d))
    sign = tl.where(d < half, -1.0, 1.0)
    rot_ok = d < ROT  # past the rotary dims: cos 1, sin 0, so RoPE gives the value back unchanged
    cos = tl.load(cos_ptr + row * cs_sb + d, mask=rot_ok, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + row * cs_sb + d, mask=rot_ok, other=0.0).to(tl.float32)
    heads = kv * GROUP + g
    qd_ok = g_ok[:, None] & d_ok[None, :]
    qx, qp = _head(q_ptr + row * q_sb + heads[:, None] * D, d[None, :], partner[None, :], qd_ok,
                   qn_ptr, eps, D, QK_NORM, 1, dt)
    q = _rope(qx, qp, sign[None, :], cos[None, :], sin[None, :], dt, ROPE_WIDE)  # [BLOCK_G, BLOCK_D]
    # The new token's k and v (only the program whose slice holds its slot uses them) are loaded
    # here, not where they are used: that program is the kernel's critical path, and its loads
    # then overlap the cache tiles' instead of following them.
    kx, kp = _head(k_ptr + row * k_sb + kv * D, d, partner, d_ok, kn_ptr, eps, D, QK_NORM, 0, dt)
    k_new = _rope(kx, kp, sign, cos, sin, dt, ROPE_WIDE)                              # [BLOCK_D]
    v_new = tl.load(v_ptr + row * v_sb + kv * D + d, mask=d_ok, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    if ONE_TILE:
        if start < end:
            m_i, l_i, acc = _attend_tile(q, kt0, v0, cols0, cols0 < end, m_i, l_i, acc, scale, mask_ptr, row,
                                         mk_sb, mk_sn, SOFTCAP, MASK_KIND)
    else:
        for s0 in range(start, end, BLOCK_N):
            cols = s0 + n
            ok = cols < end
            kt, v = _cache_tile(kc_ptr, vc_ptr, base, cols, ok, d, d_ok, c_sn)
            m_i, l_i, acc = _attend_tile(q, kt, v, cols, ok, m_i, l_i, acc, scale, mask_ptr, row, mk_sb, mk_sn,
                                         SOFTCAP, MASK_KIND)
    if (pos >= start) & (pos < start + chunk):  # this slice holds the new token
        tl.store(kc_ptr + base + pos * c_sn + d, k_new, mask=d_ok)
        tl.store(vc_ptr + base + pos * c_sn + d, v_new, mask=d_ok)
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale   # [BLOCK_G]
        if SOFTCAP > 0:
            s_new = _softcap(s_new, SOFTCAP)
        if MASK_KIND == 1:
            keep_new = tl.load(mask_ptr + row * mk_sb + pos * mk_sn) != 0
            s_new = tl.where(keep_new, s_new, float("-inf"))
        if MASK_KIND == 2:
            s_new += tl.load(mask_ptr + row * mk_sb + pos * mk_sn).to(tl.float32)
        m_new = tl.maximum(m_i, s_new)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p_new = tl.exp(s_new - m_use)
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + p_new
        p_v = p_new.to(dt).to(tl.float32)  # as the tiles' p·V rounds p to the model dtype
        acc = acc * alpha[:, None] + p_v[:, None] * v_new.to(tl.float32)[None, :]
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
             BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, ADVANCE: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # as in _attend_split
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
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
