"""Names that differ between the transformers releases we support.

transformers 5.24 renamed the KV-cache argument and output field from ``past_key_values`` to
``cache`` (the old keyword still works through a deprecation shim until 5.40). Code that reads or
passes the cache by name asks here, so one install's spelling is used throughout.
"""
import inspect

from transformers.models.llama.modeling_llama import LlamaModel

# Llama is the reference family: every release names the argument there first.
CACHE_KWARG = "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
CACHE_KWARGS = ("cache", "past_key_values")  # every spelling a caller may use


def cache_of(kwargs: dict):
    """The KV cache a caller passed under either spelling (None when it passed none)."""
    for name in CACHE_KWARGS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


def output_cache(outputs):
    """The cache a model's output carries, under this release's field name."""
    return getattr(outputs, CACHE_KWARG)
