"""Phi-3 adapter: fused qkv_proj and gate_up_proj (chunk + SiLU⊙mul extracted as slices); its residual
adds (through the layer's eval-mode dropouts) move into o_proj and down_proj (patching.residual)."""
import pytest
from transformers import Phi3Config

from .parity import check_family


@pytest.mark.parametrize("fused_residual", [False, True])
def test_phi3_parity(monkeypatch, fused_residual):
    cfg = Phi3Config(vocab_size=97, hidden_size=48, intermediate_size=67, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    check_family(cfg, monkeypatch, fused_residual)
