"""mirage_serve: patch a Hugging Face decoder model with superoptimized kernels before generate()."""
__version__ = "0.1.0"

__all__ = ["PatchOptions", "PatchReport", "attention_kernels", "patch", "unpatch"]

# Lazy: `import mirage_serve` stays cheap (no torch, no transformers) until a name is used.
_LAZY = {"patch": ".patching.pipeline", "unpatch": ".patching.pipeline", "PatchReport": ".report",
         "PatchOptions": ".options", "attention_kernels": ".decode.attention_fast"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
