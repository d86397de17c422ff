"""Gemma 2: (1+w) RMSNorms, GELU-tanh MLP after the pre-feedforward norm.

The post-attention and post-feedforward norms, attention softcapping and sliding-window layers
stay in the original modules; the extracted programs carry the (1+w) scaling and GELU-tanh.
"""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("gemma2",), mlp_norm="pre_feedforward_layernorm")
