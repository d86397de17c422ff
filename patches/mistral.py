"""Mistral: Llama layout (sliding-window attention is inside the attention, left original)."""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("mistral",))
