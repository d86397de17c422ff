"""Llama adapter: patched tiny Llama matches the unpatched model (see parity.check_family)."""
import pytest
from transformers import LlamaConfig

from .parity import check_family


@pytest.mark.parametrize("fused_residual, stacked", [(False, True), (True, True), (True, False)])
def test_llama_parity(monkeypatch, fused_residual, stacked):
    cfg = LlamaConfig(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=2,
                      num_attention_heads=5, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-5)
    report = check_family(cfg, monkeypatch, fused_residual, stacked=stacked)
    assert {s.site for s in report.sites} == {"attn_in", "attn_out", "mlp_in", "mlp_out", "final_norm"}
