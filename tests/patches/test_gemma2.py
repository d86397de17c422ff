"""Gemma 2 adapter: (1+w) RMSNorm, GELU-tanh MLP, softcapping, alternating sliding-window layers; with
the residual adds fused, each post-norm and its add run inside o_proj's / down_proj's kernel."""
import pytest
from transformers import Gemma2Config

from .parity import check_family


@pytest.mark.parametrize("fused_residual", [False, True])
def test_gemma2_parity(monkeypatch, fused_residual):
    cfg = Gemma2Config(vocab_size=97, hidden_size=45, intermediate_size=67, num_hidden_layers=2,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=8, sliding_window=6,
                       query_pre_attn_scalar=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    check_family(cfg, monkeypatch, fused_residual, post_attn=" (+ post_attention_layernorm)")
