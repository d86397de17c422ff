"""Qwen3 adapter: q/k RMSNorms stay in the attention, after the fused projection."""
import pytest
from transformers import Qwen3Config

from .parity import check_family


@pytest.mark.parametrize("fused_residual", [False, True])
def test_qwen3_parity(monkeypatch, fused_residual):
    cfg = Qwen3Config(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    check_family(cfg, monkeypatch, fused_residual)
