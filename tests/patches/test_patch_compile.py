"""torch.compile on top of a patched model (torch backend): the compiled model gives the same logits."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

import mirage_serve

from .parity import build


@pytest.mark.slow
def test_torch_compile_on_top():
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=1,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    ids = torch.tensor([[7], [3]])
    with torch.no_grad():
        ref = model(ids).logits
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,))
    assert not report.unpatched
    compiled = torch.compile(model)
    with torch.no_grad():
        got = compiled(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    mirage_serve.unpatch(model)
