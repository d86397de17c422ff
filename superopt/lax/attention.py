"""Decode attention as Hugging Face's eager attention computes it, as a Lax program.

``attention_core`` appends the core to a ``Program`` whose q / k / v values the caller made, so
that RoPE, the KV-cache write or the GQA expansion can be prepended by their own builders; the
core is written in grouped form, q [b, kv heads, group, d] against k / v [b, kv heads, L, d]
(q head h reads kv head h // group: a view of HF's [b, q heads, 1, d], no data movement):

    s = q·kᵀ · scale                      in the model dtype
    s = c · tanh(s / c)                   logit softcap (Gemma-2), optional
    s = s + mask                          additive mask [b, 1, 1, L] (causal / sliding window), optional
    p = softmax(float32(s))               max-subtracted, in fp32 (``softmax(..., dtype=float32)``)
    o = dtype(p) · v

``decode_attention_program`` builds the whole program, with an optional q RMSNorm (Qwen3's q_norm,
fp32 inside as HF computes it; Qwen3's k_norm acts on the new key before the cache write, so it
belongs to that program, not to this one).

``decode_layer_attention_program`` builds the whole site as HF runs it with a static cache: q / k
RMSNorm (Qwen3), RoPE on q and the step's k, the cache write of k / v at the position, then the
core against the updated caches; the search lowers it (docs/architecture.md, Search: the rotated k
is a program of its own, the cache writes run as library ops before the attention kernel).
"""
from __future__ import annotations

import math

from . import Program, T


def attention_core(p: Program, q: T, k: T, v: T, scale: float, softcap: float | None = None,
                   mask: T | None = None) -> T:
    """softmax(q·kᵀ·scale [softcapped] [+ mask]) · v, the softmax max-subtracted in float32."""
    if q.type.rank != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention_core: q {list(q.shape)} must be [b, kv heads, group, d] against k / v "
                         f"[b, kv heads, L, d]; got k {list(k.shape)}, v {list(v.shape)}")
    s = p.mul(p.matmul(q, p.transpose(k)), scale)                  # [b, Hkv, group, L]
    if softcap is not None:
        s = p.mul(p.tanh(p.div(s, softcap)), softcap)
    if mask is not None:
        s = p.add(s, mask)
    probs = p.softmax(p.cast(s, "float32"), stable=True)
    return p.matmul(p.cast(probs, q.dtype), v)                     # [b, Hkv, group, d]


def decode_attention_program(batch: int, q_heads: int, kv_heads: int, head_dim: int, kv_len: int,
                             dtype: str = "bfloat16", softcap: float | None = None, mask: bool = False,
                             q_norm: bool = False, eps: float = 1e-6, scale: float | None = None,
                             name: str = "decode_attention"):
    """The decode attention core at one shape (see the module docstring); inputs q, k, v [, mask]
    [, q_norm_weight]."""
    if q_heads % kv_heads:
        raise ValueError(f"decode_attention_program: {q_heads} q heads are not a multiple of {kv_heads} kv heads")
    group = q_heads // kv_heads
    p = Program(name)
    q = p.input("q", (batch, kv_heads, group, head_dim), dtype)
    k = p.input("k", (batch, kv_heads, kv_len, head_dim), dtype)
    v = p.input("v", (batch, kv_heads, kv_len, head_dim), dtype)
    m = p.input("mask", (batch, 1, 1, kv_len), dtype) if mask else None
    if q_norm:
        w = p.input("q_norm_weight", (head_dim,), dtype)
        q = p.mul(w, p.cast(p.rms_norm(p.cast(q, "float32"), eps=eps), dtype))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    p.output(attention_core(p, q, k, v, scale, softcap, m))
    return p.build()


def _qk_norm(p: Program, x: T, w: T, eps: float) -> T:
    """Qwen3's q_norm / k_norm: RMSNorm over head_dim, fp32 inside, the weight in the model dtype."""
    return p.mul(w, p.cast(p.rms_norm(p.cast(x, "float32"), eps=eps), x.dtype))


def decode_layer_attention_program(batch: int, q_heads: int, kv_heads: int, head_dim: int, kv_len: int,
                                   dtype: str = "bfloat16", softcap: float | None = None, qk_norm: bool = False,
                                   eps: float = 1e-6, scale: float | None = None,
                                   name: str = "decode_layer_attention"):
    """The whole decode-attention site of one layer, as HF computes it with a static cache.

    Inputs: ``q`` [b, Hq, 1, d], ``k`` / ``v`` [b, Hkv, 1, d] (the step's projections, heads
    first), ``cos`` / ``sin`` [b, 1, 1, d] (the rotary table at the position), ``k_cache`` /
    ``v_cache`` [b, Hkv, L, d], ``pos`` [1] int64 (the cache position), ``mask`` [b, 1, 1, L]
    (HF's additive static-cache mask: 0 where attended, −inf-like elsewhere; a sliding window is
    the same input with the positions before the window masked too, so it needs no program of its
    own) [, ``q_norm_weight`` / ``k_norm_weight`` [d] (Qwen3)].

    Ops: (q / k RMSNorm) → RoPE on q and k → cache write of k and v at ``pos`` (``index_copy_``) →
    the attention core (``attention_core``) against the updated caches, q viewed grouped
    [b, Hkv, group, d] (a reshape of [b, Hq, 1, d]: GQA without a copy). Outputs: the attention
    output viewed back as [b, Hq, 1, d], and the updated k / v caches.
    """
    if q_heads % kv_heads:
        raise ValueError(f"decode_layer_attention_program: {q_heads} q heads are not a multiple of "
                         f"{kv_heads} kv heads")
    if head_dim % 2:
        raise ValueError(f"decode_layer_attention_program: RoPE needs an even head_dim, got {head_dim}")
    group = q_heads // kv_heads
    p = Program(name)
    q = p.input("q", (batch, q_heads, 1, head_dim), dtype)
    k = p.input("k", (batch, kv_heads, 1, head_dim), dtype)
    v = p.input("v", (batch, kv_heads, 1, head_dim), dtype)
    cos = p.input("cos", (batch, 1, 1, head_dim), dtype)
    sin = p.input("sin", (batch, 1, 1, head_dim), dtype)
    k_cache = p.input("k_cache", (batch, kv_heads, kv_len, head_dim), dtype)
    v_cache = p.input("v_cache", (batch, kv_heads, kv_len, head_dim), dtype)
    pos = p.input("pos", (1,), "int64")
    mask = p.input("mask", (batch, 1, 1, kv_len), dtype)
    q = p.reshape(q, (batch, kv_heads, group, head_dim))   # grouped view: q head h reads kv head h // group
    if qk_norm:
        qw = p.input("q_norm_weight", (head_dim,), dtype)
        kw = p.input("k_norm_weight", (head_dim,), dtype)
        q, k = _qk_norm(p, q, qw, eps), _qk_norm(p, k, kw, eps)
    q, k = p.rope(q, cos, sin), p.rope(k, cos, sin)
    k_all = p.scatter(k_cache, pos, k, 2)
    v_all = p.scatter(v_cache, pos, v, 2)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    o = attention_core(p, q, k_all, v_all, scale, softcap, mask)
    p.output(p.reshape(o, (batch, q_heads, 1, head_dim)), k_all, v_all)
    return p.build()
