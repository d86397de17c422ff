"""Qwen2 adapter: q/k/v biases are extracted with the fused projection."""
import pytest
from transformers import Qwen2Config

from .parity import check_family


@pytest.mark.parametrize("fused_residual, stacked", [(False, True), (True, True), (True, False)])
def test_qwen2_parity(monkeypatch, fused_residual, stacked):
    cfg = Qwen2Config(vocab_size=97, hidden_size=44, intermediate_size=67, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=10)
    report = check_family(cfg, monkeypatch, fused_residual, stacked=stacked)
    assert len(report.sites) == 4 * 3 + 1  # 4 sites a layer, and the final norm
