"""Shared parity check for family adapters: a tiny random model, patched vs unpatched, fp32.

`check_family(config)` builds a 2–4-layer model from ``config``, patches it on CPU (torch
backend, search off to keep CI fast), and asserts: every declared site patched; the kernels
really ran; logits allclose and greedy tokens identical for 16 steps at batch 1 and batch 3
(left padded); sampling with a fixed seed identical; static cache and repeated generate() work; state_dict keys,
parameter storage and memory unchanged; unpatch gives bit-identical logits.
"""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

import mirage_serve
from mirage_serve.patching import prepare
from mirage_serve.options import PatchOptions

STEPS = 16
BUCKETS = (4,)  # decode (1 or 3 rows) runs the bucket-4 kernel, zero-padded; prefill -> original



def programs_per_forward(report) -> int:
    """Programs a decode-sized forward runs: every part of every site, less each norm site's norm
    program, which patching.install defers and nothing on that path needs."""
    return sum(s.parts - (s.parts > 1) for s in report.sites)  # a norm site: its consumers and its norm

def build(config, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norm weights: around 1 (and around 0 for Gemma's (1+w))
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (0.0 if "gemma" in config.model_type else 1.0))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return model


def prompts(vocab: int, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch-1 prompt and a left-padded batch of 3 prompts of lengths 7, 3, 5 (+ mask)."""
    g = torch.Generator().manual_seed(7)
    ids1 = torch.randint(1, vocab, (1, 6), generator=g)
    lens = (7, 3, 5)
    ids3 = torch.full((3, 7), pad)
    mask3 = torch.zeros(3, 7, dtype=torch.long)
    for i, n in enumerate(lens):
        ids3[i, 7 - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask3[i, 7 - n:] = 1
    return ids1, ids3, mask3


def _generate(model, ids, mask, **kw):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=STEPS, min_new_tokens=STEPS,
                         return_dict_in_generate=True, output_logits=True, pad_token_id=0, **kw)
    return out.sequences, torch.stack(out.logits, 1)


def _param_memory(model) -> int:
    """Bytes of the distinct storages the parameters live in: a fused copy of a weight adds one, while
    stacked projections (patching.stacking) move their weights into one storage of the same size."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


def check_family(config, monkeypatch, fused_residual: bool = False, post_attn: str = "",
                 stacked: bool = True) -> mirage_serve.PatchReport:
    """``fused_residual``: every layer's o_proj and down_proj sites must take the residual
    (patching.residual, the default) on decode-sized forwards; False: with
    ``PatchOptions(fused_residual=False)``, none may. ``stacked``: q/k/v as one stacked projection
    (``PatchOptions.stacked_projections``, the default), the attention input site then one program and its norm;
    False: each consumer a program of its own. ``post_attn``: how the report names the norm
    fused after o_proj, if any (" (+ post_attention_layernorm)")."""
    model = build(config)
    ids1, ids3, mask3 = prompts(config.vocab_size, pad=0)
    short = ids3[:, -1:]  # [3, 1]: a decode-sized forward that goes through the kernels
    with torch.no_grad():
        before_short = model(short).logits
        before_full = model(ids3, attention_mask=mask3).logits
    ref = {b: _generate(model, ids, m) for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items()}
    torch.manual_seed(11)
    ref_sample = model.generate(ids1, max_new_tokens=STEPS, do_sample=True, top_k=0, pad_token_id=0)
    keys = list(model.state_dict())
    mem = _param_memory(model)

    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=BUCKETS,
                                options=PatchOptions(fused_residual=fused_residual, stacked_projections=stacked))
    assert report.supported, str(report)
    assert report.sites and not report.unpatched, str(report)
    # the model's final norm is a site of its own, outside the layers (patching.final_norm)
    assert [(s.layer, s.site) for s in report.sites if s.layer < 0] == [(-1, "final_norm")], str(report)
    assert all(s.check_error is not None and s.check_error <= 1e-5 for s in report.sites), str(report)
    assert list(model.state_dict()) == keys
    assert _param_memory(model) == mem  # no fused copies

    calls, with_residual = [], []
    run = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, x, *r: (
        calls.append(x.shape), with_residual.append(bool(r)))[0] or run(self, x, *r))
    with torch.no_grad():
        got_short = model(short).logits
    layers = len({s.layer for s in report.sites if s.layer >= 0})
    if fused_residual:
        assert sum(with_residual) == 2 * layers, str(report)
        assert "residual adds: in the kernels of mlp.down_proj" in report.note, report.note
        assert f"self_attn.o_proj{post_attn} in {layers}/{layers} layers" in report.note, report.note
        assert {s.site for s in report.sites if s.program} >= {"attn_out", "mlp_out"}
    else:
        assert not any(with_residual)
    # every site of every layer ran its kernels: a norm site runs each group of consumers as a
    # program of its own (sites.site_parts) and defers its norm program (patching.install)
    runs = programs_per_forward(report)
    assert all(s.parts >= 2 for s in report.sites if s.site.endswith("_in")), str(report)
    if stacked:
        assert all(s.parts == 2 for s in report.sites if s.site == "attn_in"), str(report)
    assert len(calls) == runs, calls
    torch.testing.assert_close(got_short, before_short, rtol=1e-4, atol=1e-5)
    for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items():
        seq, logits = _generate(model, ids, m)
        assert torch.equal(seq, ref[b][0]), f"batch {b}: greedy tokens differ"
        torch.testing.assert_close(logits, ref[b][1], rtol=1e-4, atol=1e-4)
    assert len(calls) >= runs * (1 + 2 * (STEPS - 1))  # decode steps used kernels
    torch.manual_seed(11)
    sample = model.generate(ids1, max_new_tokens=STEPS, do_sample=True, top_k=0, pad_token_id=0)
    assert torch.equal(sample, ref_sample)
    static, _ = _generate(model, ids3, mask3, cache_implementation="static")  # also a repeated call
    assert torch.equal(static, ref[3][0]), "static cache: greedy tokens differ"

    assert mirage_serve.unpatch(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(short).logits, before_short)
        assert torch.equal(model(ids3, attention_mask=mask3).logits, before_full)
    assert list(model.state_dict()) == keys
    return report
