"""patch() on bad or unusual inputs: clear errors or per-site reasons, and the model left untouched."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

import mirage_serve
from mirage_serve import backends
from mirage_serve.patching import prepare, install
from mirage_serve.patching.pipeline import PatchError, is_patched

from .parity import build, programs_per_forward


def _config(layers: int = 2) -> LlamaConfig:
    return LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=layers,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=8)


def _untouched(model) -> bool:
    return not is_patched(model) and all("forward" not in m.__dict__ for m in model.modules())


def _patch(model, **kw):
    kw = {"backend": "torch", "search_budget": 0, "batch_sizes": (2,), **kw}
    return mirage_serve.patch(model, **kw)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


IDS = torch.tensor([[5, 17, 3], [8, 1, 60]])[:, -1:]  # [2, 1]: one decode step, batch 2


def test_meta_device_is_refused():
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config()).eval()
    with pytest.raises(PatchError, match="meta device"):
        _patch(model)
    assert _untouched(model)


def test_unknown_backend_lists_valid_ones():
    model = build(_config(1))
    with pytest.raises(ValueError, match="valid backends: auto, torch, triton"):
        _patch(model, backend="tensorrt")
    assert _untouched(model)


def test_gpu_backend_on_cpu_is_refused():
    model = build(_config(1))
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        _patch(model, backend="triton")
    assert _untouched(model)


def test_training_mode_is_refused():
    model = build(_config(1)).train()
    with pytest.raises(PatchError, match="training mode"):
        _patch(model)
    assert _untouched(model)


def test_unsupported_family_is_reported_not_raised():
    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).eval()
    report = _patch(model)
    assert not report.supported and "'gpt2' is not supported" in report.note and "llama" in report.note
    assert "not supported" in str(report)
    assert _untouched(model)
    with pytest.raises(PatchError, match="gpt2"):
        _patch(model, strict=True)


class FakeQuantLinear(nn.Linear):
    """Stands for a quantized linear (bitsandbytes, GPTQ…): a subclass with its own kernel."""


def test_quantized_layer_leaves_only_its_site_original():
    model = build(_config())
    ref = _logits(model, IDS)
    old = model.model.layers[0].self_attn.k_proj
    q = FakeQuantLinear(old.in_features, old.out_features, bias=False)
    q.weight = old.weight
    model.model.layers[0].self_attn.k_proj = q
    report = _patch(model)
    bad = [s for s in report.sites if not s.patched]
    assert [(s.layer, s.site) for s in bad] == [(0, "attn_in")]
    assert "quantized or unsupported layer type FakeQuantLinear" in bad[0].reason
    torch.testing.assert_close(_logits(model, IDS), ref, rtol=1e-4, atol=1e-5)
    mirage_serve.unpatch(model)
    assert torch.equal(_logits(model, IDS), ref)


def test_unknown_aten_op_leaves_the_site_original():
    model = build(_config())

    class Sine(nn.Module):
        def forward(self, x):
            return torch.sin(x)

    for layer in model.model.layers:
        layer.mlp.act_fn = Sine()
    ref = _logits(model, IDS)
    report = _patch(model)
    bad = {(s.layer, s.site): s.reason for s in report.unpatched}
    assert set(bad) == {(0, "mlp_in"), (1, "mlp_in")}
    assert all("aten.sin.default" in r for r in bad.values())
    torch.testing.assert_close(_logits(model, IDS), ref, rtol=1e-4, atol=1e-5)


def test_numeric_self_check_rejects_a_wrong_kernel(monkeypatch):
    model = build(_config(1))
    real = backends.build

    def off_by_a_bit(graph, backend, device, *args, **kwargs):
        ex = real(graph, backend, device, *args, **kwargs)
        return backends.Executor(lambda *ts: [o * (1 + 1e-4) for o in ex.run(*ts)], ex.backend,
                                 ex.differentiable, ex.compiled, ex.seconds)

    monkeypatch.setattr(backends, "build", off_by_a_bit)
    report = _patch(model)
    assert report.sites and not report.patched
    assert all("numeric self-check failed" in s.reason for s in report.sites)
    assert all(s.check_error and 5e-5 < s.check_error < 2e-4 for s in report.sites)
    assert _untouched(model)


def test_failure_while_swapping_undoes_every_swap(monkeypatch):
    model = build(_config())
    ref = _logits(model, IDS)
    real, calls = install.install, []

    def fail_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        real(*args)

    monkeypatch.setattr("mirage_serve.patching.pipeline.install", fail_third)
    with pytest.raises(RuntimeError, match="boom"):
        _patch(model)
    assert _untouched(model)
    assert torch.equal(_logits(model, IDS), ref)


def test_prefill_training_and_repatch(monkeypatch):
    model = build(_config())
    report = _patch(model, batch_sizes=(1, 2))
    # (stacked q/k/v, gate+up, o, down, the norm) x 2 buckets, shared by layers and the final norm
    assert len(report.patched) == 9 and report.programs == 10
    text = str(report)
    assert "attn_in" in text and "no speed-up" in text and "9/9 sites patched" in text
    with pytest.raises(PatchError, match="already patched"):
        _patch(model)
    calls = []
    run = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, x, *r: calls.append(1) or run(self, x, *r))
    _logits(model, torch.tensor([[5, 17, 3]]))  # 3 tokens > largest bucket: prefill, original modules
    assert not calls
    model.train()
    model(IDS)  # training mode: original modules (and autograd) after patch, too
    assert not calls
    model.eval()
    _logits(model, IDS)
    assert len(calls) == programs_per_forward(report)  # every program of every site ran
    assert mirage_serve.unpatch(model) and not mirage_serve.unpatch(model)
    assert _untouched(model)


def test_cuda_graphs_need_a_cuda_model_and_leave_it_untouched():
    model = build(_config())
    with pytest.raises(PatchError, match="cuda_graphs=True needs a model on a CUDA device"):
        _patch(model, cuda_graphs=True)
    assert _untouched(model) and "generate" not in model.__dict__


def test_cpu_patch_leaves_generate_alone_and_unpatch_removes_everything():
    model = build(_config())
    report = _patch(model)
    assert report.cuda_graphs is False and "generate" not in model.__dict__
    mirage_serve.unpatch(model)
    assert _untouched(model)
