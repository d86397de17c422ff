"""Phi-3: fused qkv_proj and gate_up_proj (the MLP's chunk + SiLU⊙mul is extracted as slices)."""
from mirage_serve.patching.sites import llama_like

FAMILY = llama_like(("phi3",), qkv=("qkv_proj",))
