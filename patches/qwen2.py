"""Qwen2 / Qwen2.5: Llama layout; q/k/v projections carry a bias (extracted with the matmul)."""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("qwen2",))
