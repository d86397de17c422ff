"""Cases of the decode-attention fast path, shared by the interpreter run and the GPU tests.

Importing this module sets nothing: Triton (and the kernels) are imported inside the functions,
so ``attention_interp_run`` can set TRITON_INTERPRET first.
"""
from __future__ import annotations

import torch
from transformers import (AutoConfig, Gemma2Config, Gemma3TextConfig, GraniteConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config,
                          Qwen3Config)

# (rows, q heads, kv heads, head dim, capacity, slot, mask kind, per-head q/k RMSNorm form (0 none, 1 HF's
#  usual, 2 Gemma-3's 1 + weight), logit softcap or 0, rotary dims or 0 for the whole head, cos/sin in float32)
KERNEL_CASES = {
    "mha_first_slot": (1, 4, 4, 32, 64, 0, "none", 0, 0.0, 0, False),
    "gqa7_bool_padded": (3, 14, 2, 64, 200, 131, "bool", 0, 0.0, 0, False),
    "d96_additive_last_slot": (2, 6, 2, 96, 130, 129, "additive", 0, 0.0, 0, False),
    "many_splits_broadcast_mask": (2, 3, 1, 16, 1000, 517, "bool1", 0, 0.0, 0, False),
    "qk_norm_gqa4": (2, 8, 2, 64, 150, 77, "bool", 1, 0.0, 0, False),
    "qk_norm_d96_padded_lanes": (1, 3, 1, 96, 70, 69, "none", 1, 0.0, 0, False),
    # Gemma-3's per-head norms: times 1 + weight, in float32 (weights near 0, as Gemma's are)
    "qk_norm_one_plus_weight": (2, 8, 2, 64, 150, 77, "bool", 2, 0.0, 0, False),
    # scores of |s| ~ 3-10 (q scaled up) against a cap of 5: tanh far from linear, as Gemma-2's cap of 50 bites
    "softcap_gqa2_bool": (2, 4, 2, 32, 150, 90, "bool", 0, 5.0, 0, False),
    # StableLM-2: RoPE on the first quarter of each head, the rest passed through
    "partial_rotary_quarter": (2, 8, 2, 64, 150, 77, "bool", 0, 0.0, 16, False),
    # OLMo-2: cos and sin in float32 beside fp16 / bf16 q and k, RoPE computed in float32 and rounded once
    "rope_in_float32": (2, 8, 2, 64, 150, 77, "bool", 0, 0.0, 0, True),
    # a cache too long for one tile a slice in four waves (8 row-heads × 68 tiles > 4 × 132 SMs, and > 4 × the
    # interpreter's 8): slices of several tiles, so the loop runs (the cases above are one tile a slice)
    "multi_tile_slices": (2, 8, 4, 16, 4300, 3001, "bool", 0, 0.0, 0, False),
}
EPS = 1e-6


def _rms(x, w, form: int = 1):  # x: [b, H, d]; HF's RMSNorm over the head dim in that form, in float64
    return (w if form == 1 else 1.0 + w) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _rope(x, cos, sin):  # x: [b, H, d]; cos, sin: [b, r] — HF's rotate-half convention on the first r dims
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    half = r // 2
    turned = torch.cat((-xr[..., half:], xr[..., :half]), -1)
    return torch.cat((xr * cos[:, None] + turned * sin[:, None], rest), -1)


def kernel_case(rows, hq, hkv, d, cap, slot, kind, qk_norm, softcap, rot, wide_rope, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = rnd(rows, hq * d), rnd(rows, hkv * d), rnd(rows, hkv * d)
    rot = rot or d
    ang = rnd(rows, rot // 2).repeat(1, 2) * 3
    cos, sin = ang.cos(), ang.sin()
    keys, values = rnd(rows, hkv, cap, d), rnd(rows, hkv, cap, d)
    qw, kw = (1.0 if qk_norm == 1 else 0.0) + 0.3 * rnd(d), (1.0 if qk_norm == 1 else 0.0) + 0.3 * rnd(d)
    if qk_norm:
        q, k = q * 3.0, k * 0.2  # heads with an RMS far from 1, so a missing norm would show
    if softcap:
        q = q * 6.0
    valid = torch.ones(rows, cap, dtype=torch.bool)
    valid[:, slot + 1:] = False
    if kind in ("bool", "additive"):
        for r in range(rows):
            valid[r, : min(r * 3, slot)] = False  # left padding, row r: 3r slots
    mask = {"none": None, "bool": valid, "bool1": valid[:1],
            "additive": torch.where(valid, 0.0, -1e30)}[kind]
    if kind == "bool1":
        valid = valid[:1].expand(rows, cap)
    from mirage_serve.decode.attention_launch import decode_attention

    t = getattr(torch, dtype)
    args = [x.to(torch.float32 if wide_rope and i in (3, 4) else t).to(device)
            for i, x in enumerate((q, k, v, cos, sin, keys, values, qw, kw))]
    q, k, v, cos, sin, keys, values, qw, kw = (x.double().cpu() for x in args)  # the reference sees the rounded inputs
    kc, vc = args[5].clone(), args[6].clone()
    counter = torch.tensor(slot, dtype=torch.int64, device=device)
    m4 = None if mask is None else (mask.to(t) if kind == "additive" else mask).to(device)
    norm = (args[7], args[8], EPS, qk_norm) if qk_norm else None
    out = decode_attention(*args[:5], kc, vc, counter, m4, d ** -0.5, advance=counter, qk_norm=norm,
                           softcap=softcap, rotary_dim=rot).cpu()
    kc, vc, args = kc.cpu(), vc.cpu(), [x.cpu() for x in args]

    q, k = q.view(rows, hq, d), k.view(rows, hkv, d)
    if qk_norm:
        q, k = _rms(q, qw, qk_norm), _rms(k, kw, qk_norm)
    qr = _rope(q, cos, sin)
    kr = _rope(k, cos, sin)
    keys[:, :, slot], values[:, :, slot] = kr, v.view(rows, hkv, d)
    kx = keys.repeat_interleave(hq // hkv, 1)
    vx = values.repeat_interleave(hq // hkv, 1)
    s = torch.einsum("bhd,bhnd->bhn", qr, kx) * d ** -0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~valid[:, None], float("-inf"))
    ref = torch.einsum("bhn,bhnd->bhd", s.softmax(-1), vx).reshape(rows, hq * d)

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())
    others = torch.ones(cap, dtype=torch.bool)
    others[slot] = False
    return {"out": rel(out, ref), "key_slot": rel(kc[:, :, slot], kr),
            "value_slot": rel(vc[:, :, slot], v.view(rows, hkv, d)),
            "others_untouched": bool(torch.equal(kc[:, :, others], args[5][:, :, others])
                                     and torch.equal(vc[:, :, others], args[6][:, :, others])),
            "advanced": int(counter) == slot + 1}


FAMILIES = {
    "llama": LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "qwen2_eager_mask": Qwen2Config(vocab_size=97, hidden_size=56, intermediate_size=80, num_hidden_layers=2,
                                    num_attention_heads=7, num_key_value_heads=1, head_dim=8),
    "qwen3": Qwen3Config(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=2,
                         num_attention_heads=3, num_key_value_heads=1, head_dim=8),
    "phi3": Phi3Config(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, pad_token_id=0),
    # sliding layers whose window holds the whole generation (7 + 16 tokens) take the fast path too
    "gemma3": Gemma3TextConfig(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=3,
                               num_attention_heads=5, num_key_value_heads=1, head_dim=8, sliding_window=32,
                               query_pre_attn_scalar=8, sliding_window_pattern=2),
    "phi3_window": Phi3Config(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, sliding_window=32),
    # attention logit softcapping (50) in the kernel; sliding layers with room for the generation
    "gemma2": Gemma2Config(vocab_size=97, hidden_size=48, intermediate_size=67, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=32,
                           query_pre_attn_scalar=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    # q_norm / k_norm over the whole projection (not per head): the module's norms, then the kernels
    "olmo2": AutoConfig.for_model("olmo2", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2),
    "mistral": MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=None),
}

# the same Gemma 3 with a window of 6: its sliding layers are full from the first decode step and keep HF's forward
SMALL_WINDOW = Gemma3TextConfig(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=3,
                                num_attention_heads=5, num_key_value_heads=1, head_dim=8, sliding_window=6,
                                query_pre_attn_scalar=8, sliding_window_pattern=2)
# a family with no adapter whose RoPE turns a quarter of each head (StableLM-2's partial rotary)
STABLELM = AutoConfig.for_model("stablelm", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
# OLMo-2 wide enough that the searched designs of its q/k/v projection sites (projections alone: it has no
# input norm) hand back [rows, n] in another layout than row-major (strides (1, rows)); the kernels read a copy
OLMO2_SEARCHED = AutoConfig.for_model("olmo2", vocab_size=97, hidden_size=128, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# a family with no adapter in patches/: patch() finds its attention module by what the fast path needs
GRANITE = GraniteConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, attention_multiplier=0.25,
                        residual_multiplier=0.5, embedding_multiplier=2.0, pad_token_id=0)


def _decode(model, ids, mask):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                         pad_token_id=0, cache_implementation="static", return_dict_in_generate=True,
                         output_logits=True)
    return out.sequences, torch.stack(out.logits, 1)


def family_case(name, config, how="install", attention="hand-written"):
    import mirage_serve
    from mirage_serve.decode import attention_fast
    from mirage_serve.decode.attention_fast import attention_kernels, attention_verdicts, install_fast_attention
    from mirage_serve.decode.attention_searched import SearchedGraph
    from mirage_serve.options import PatchOptions
    from tests.patches.parity import build, prompts

    if name.startswith("qwen2_eager"):
        config._attn_implementation = "eager"  # an additive float mask instead of SDPA's boolean one
    model = build(config)
    ids1, ids, mask = prompts(config.vocab_size, pad=0)
    if how == "unpadded":  # one row, no padding: HF may pass no mask at all
        ids, mask = ids1, None
    with torch.no_grad():
        ref_seq, ref_logits = _decode(model, ids, mask)
        if how in ("patch", "patch_residual", "patch_searched"):
            fused = how != "patch"  # the layer's residual adds inside o_proj/down_proj too
            # searched: the sites' μGraphs are searched designs (their outputs' layouts are theirs),
            # else the programs themselves (library ops), which keeps the interpreter run short
            budget = {} if how == "patch_searched" else {"search_budget": 0}
            report = mirage_serve.patch(model, backend="torch", batch_sizes=(4,),
                                        options=PatchOptions(fused_residual=fused, attention=attention), **budget)
            assert report.patched, str(report)
            assert ("residual adds: in the" in report.note) == fused, report.note
        else:
            layers = model.model.layers
            install_fast_attention(layers, "self_attn", model.config, [])
        calls, kinds = [], []
        real, real_graph = attention_fast.decode_attention, SearchedGraph.__call__

        def counted(*a, **kw):
            if how == "mutant":  # a wrong kernel: the softmax scale off by 10%
                a = a[:9] + (a[9] * 1.1,) + a[10:]
            calls.append("none" if a[8] is None else str(a[8].dtype).replace("torch.", ""))
            kinds.append("hand-written")
            return real(*a, **kw)

        def counted_graph(self, *a):  # the searched μGraph: the same arguments as the kernels, bar the scale
            calls.append(str(a[8].dtype).replace("torch.", ""))
            kinds.append("searched")
            return real_graph(self, *a)
        attention_fast.decode_attention, SearchedGraph.__call__ = counted, counted_graph
        try:
            seq, logits = _decode(model, ids, mask)
        finally:
            attention_fast.decode_attention, SearchedGraph.__call__ = real, real_graph
    fused_norms = sum(m.__dict__["forward"].qk_norm is not None for m in model.modules()
                      if isinstance(m.__dict__.get("forward"), attention_fast.FastAttention))
    out = {"tokens_equal": bool(torch.equal(seq, ref_seq)),
           "logits_err": float((logits - ref_logits).norm() / ref_logits.norm()),
           "fast_calls": len(calls), "masks": sorted(set(calls)), "verdicts": attention_verdicts(model),
           "qk_norm_fused": fused_norms, "kernel_layers": sorted(attention_fast.kernel_layers(model)),
           "kernels": sorted(set(kinds)), "why": sorted(set(attention_kernels(model).values()))}
    if how.startswith("patch"):  # unpatch takes the attention forwards away with the sites
        mirage_serve.unpatch(model)
        with torch.no_grad():
            again, again_logits = _decode(model, ids, mask)
        out["unpatched_clean"] = all("forward" not in m.__dict__ for m in model.modules())
        out["unpatched_identical"] = bool(torch.equal(again, ref_seq) and torch.equal(again_logits, ref_logits))
    return out
