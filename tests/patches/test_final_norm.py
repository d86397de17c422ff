"""The model's final norm as a site of its own (mirage_serve.patching.final_norm): found from the data
flow, its output handed out as a copy outside CUDA-graph capture, left alone when switched off."""
import pytest
import torch
from transformers import Gemma2Config, LlamaConfig, Olmo2Config

import mirage_serve
from mirage_serve.options import PatchOptions
from mirage_serve.patching import install, prepare
from mirage_serve.patching.final_norm import find_final_norm

from .parity import build

LLAMA = LlamaConfig(vocab_size=61, hidden_size=37, intermediate_size=53, num_hidden_layers=2,
                    num_attention_heads=1, num_key_value_heads=1, head_dim=12)


@pytest.mark.parametrize("cfg", [
    LLAMA,
    Gemma2Config(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16),
    Olmo2Config(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1),
], ids=lambda c: c.model_type)
def test_found_from_the_data_flow(cfg):
    model = build(cfg)
    layers = model.get_submodule("model.layers")
    assert find_final_norm(model, "model.layers", layers) == "model.norm"
    # a model whose last layer's output goes to no norm has none
    model.model.norm = torch.nn.Identity()
    assert find_final_norm(model, "model.layers", layers) is None


def test_output_is_not_reused_across_calls():
    """Outside graph capture each call gets its own tensor: the kernel's output buffer is reused."""
    model = build(LLAMA)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,))
    site, = [s for s in report.sites if s.site == "final_norm"]
    assert site.patched and site.modules == ("model.norm",), str(report)
    g = torch.Generator().manual_seed(3)
    x1, x2 = (torch.randn(2, 1, 37, generator=g) for _ in range(2))
    with torch.no_grad():
        y1 = model.model.norm(x1)
        kept = y1.clone()
        y2 = model.model.norm(x2)
        want = model.model.norm.__class__.forward(model.model.norm, x2)  # the module's own forward
    assert torch.equal(y1, kept) and y1.data_ptr() != y2.data_ptr()
    torch.testing.assert_close(y2, want, rtol=1e-5, atol=1e-6)


def test_copied_only_outside_capture(monkeypatch):
    """In a captured decode step the output is the graph's static buffer anyway: no copy, no launch."""
    model = build(LLAMA)
    mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,))
    buffer = torch.randn(1, 1, 37)
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, x, *r: [buffer])
    x = torch.randn(1, 1, 37)
    with torch.no_grad():
        copied = model.model.norm(x)
        monkeypatch.setattr(install, "_capturing", lambda: True)
        assert model.model.norm(x) is buffer
    assert copied is not buffer and torch.equal(copied, buffer)


def test_switched_off_and_unpatched():
    model = build(LLAMA)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,),
                                options=PatchOptions(final_norm=False))
    assert report.sites and "final_norm" not in {s.site for s in report.sites if s.layer < 0}
    assert "forward" not in model.model.norm.__dict__
    mirage_serve.unpatch(model)
    mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,))
    assert "forward" in model.model.norm.__dict__
    mirage_serve.unpatch(model)
    assert "forward" not in model.model.norm.__dict__
