"""Family adapters (one module per HF ``config.model_type``): which modules form which block.

Each adapter module defines ``FAMILY`` (a ``mirage_serve.patching.sites.Family``). ``family_for`` maps a
``config.model_type`` to it; adding a family is one small module plus a line in ``_MODULES``.
"""
from __future__ import annotations

import importlib

_MODULES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3")


def family_for(model_type: str):
    """The ``Family`` declared for ``model_type``, or None when the family is not supported."""
    for mod in _MODULES:
        fam = importlib.import_module(f"{__name__}.{mod}").FAMILY
        if model_type in fam.model_types:
            return fam
    return None


def supported_model_types() -> tuple[str, ...]:
    return tuple(t for mod in _MODULES for t in importlib.import_module(f"{__name__}.{mod}").FAMILY.model_types)
