"""Qwen3: Llama layout; the per-head q/k RMSNorms run after the fused projection, unchanged."""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("qwen3",))
