"""Gemma 3 adapter (text model): Gemma 2 layout plus q/k norms and local/global layers."""
from transformers import Gemma3TextConfig

from .parity import check_family


def test_gemma3_parity(monkeypatch):
    cfg = Gemma3TextConfig(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=3,
                           num_attention_heads=5, num_key_value_heads=1, head_dim=8, sliding_window=6,
                           query_pre_attn_scalar=8, sliding_window_pattern=2)
    check_family(cfg, monkeypatch)
