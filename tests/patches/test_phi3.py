"""Phi-3 adapter: fused qkv_proj and gate_up_proj (chunk + SiLU⊙mul extracted as slices)."""
from transformers import Phi3Config

from .parity import check_family


def test_phi3_parity(monkeypatch):
    cfg = Phi3Config(vocab_size=97, hidden_size=48, intermediate_size=67, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    check_family(cfg, monkeypatch)
