"""Llama (and SmolLM2, which is Llama): pre-RMSNorm attention and SiLU-gated MLP."""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("llama",))
