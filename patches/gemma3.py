"""Gemma 3 (text): Gemma 2 layout; q/k norms and local/global attention stay original."""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("gemma3", "gemma3_text"), mlp_norm="pre_feedforward_layernorm")
