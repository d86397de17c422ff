"""Mistral adapter: Llama layout with a sliding window short enough to matter in 16 steps."""
import pytest
from transformers import MistralConfig

from .parity import check_family


@pytest.mark.parametrize("fused_residual", [False, True])
def test_mistral_parity(monkeypatch, fused_residual):
    cfg = MistralConfig(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=2,
                        num_attention_heads=5, num_key_value_heads=5, head_dim=8, sliding_window=6)
    check_family(cfg, monkeypatch, fused_residual)
