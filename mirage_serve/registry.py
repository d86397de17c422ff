"""The model registry: popular checkpoints' config.json facts (models/*.json), their sizes, HF configs.

Each entry is a JSON file `{"name", "hub_id", "config": {...config.json facts...}}` shipped as package data
of `mirage_serve.models`. No weights: `bench` builds the architecture with random weights.

Sizes are computed from the config facts alone (no torch), so `mirage-serve models` is instant:
- `param_count`: every parameter of the HF model (embedding, layers, final norm, untied lm_head).
- `decode_bytes`: bytes read from memory per decode step = all decoder layers + final norm + lm_head
  (the vocab × hidden matrix, whether tied or not); the one embedding row gathered per token is
  negligible. KV-cache reads are excluded: the floor is the weight stream (docs/measuring.md).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
import json
from pathlib import Path
from typing import Any, Mapping

# Families whose decoder layer has four RMSNorms (pre/post attention, pre/post feed-forward).
_FOUR_NORM_FAMILIES = frozenset({"gemma2", "gemma3_text"})
# Families that RMS-normalise q and k per head (one head_dim weight each).
_QK_NORM_FAMILIES = frozenset({"qwen3", "gemma3_text"})
# Families that RMS-normalise q and k across all heads at once (OLMo-2: weights of q_out and kv_out).
_FULL_QK_NORM_FAMILIES = frozenset({"olmo2"})
# Families whose q/k/v projections always carry a bias, whatever attention_bias says.
_QKV_BIAS_FAMILIES = frozenset({"qwen2"})

# The dtypes a user names on the command line and in cache keys, and the IR / torch name of each.
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def torch_dtype(short: str):
    """``torch.bfloat16`` for ``"bf16"`` …; a clear error for any other name."""
    import torch

    if short not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {short!r}")
    return getattr(torch, DTYPE_NAMES[short])


def short_dtype(dtype) -> str:
    """``"bf16"`` for ``torch.bfloat16`` (or ``"bfloat16"``); the name itself for a dtype without one."""
    name = str(dtype).removeprefix("torch.")
    return next((s for s, n in DTYPE_NAMES.items() if n == name), name)


class UnknownModelError(LookupError):
    """A name that is not in the registry; `suggestions` holds the closest registered names."""

    def __init__(self, name: str, suggestions: list[str]):
        self.name = name
        self.suggestions = suggestions
        hint = f"; closest: {', '.join(suggestions)}" if suggestions else ""
        super().__init__(f"unknown model {name!r}{hint} (see `mirage-serve models`)")


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One registered checkpoint: its short name, hub id and config.json facts."""

    name: str
    hub_id: str
    config: Mapping[str, Any]

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    def with_overrides(self, **overrides: Any) -> "ModelEntry":
        """The same entry with some config facts replaced (e.g. fewer layers for a quick run)."""
        cfg = dict(self.config)
        cfg.update({k: v for k, v in overrides.items() if v is not None})
        return dataclasses.replace(self, config=cfg)


def _registry_files():
    """The registry's JSON files: package data when installed; the checkout's models/ when the
    source tree runs through PYTHONPATH (no package-dir mapping, as on the GPU machine)."""
    try:
        return list(importlib.resources.files("mirage_serve.models").iterdir())
    except ModuleNotFoundError:
        return list((Path(__file__).resolve().parents[1] / "models").iterdir())


@functools.lru_cache(maxsize=1)
def _load_all() -> dict[str, ModelEntry]:
    entries = {}
    for res in _registry_files():
        if not res.name.endswith(".json"):
            continue
        doc = json.loads(res.read_text())
        entries[doc["name"]] = ModelEntry(doc["name"], doc["hub_id"], doc["config"])
    return dict(sorted(entries.items(), key=lambda kv: kv[0].lower()))


def names() -> list[str]:
    return list(_load_all())


def entries() -> list[ModelEntry]:
    return list(_load_all().values())


def suggest(name: str, n: int = 3) -> list[str]:
    """Closest registered names, case-insensitively (difflib ratio ≥ 0.4)."""
    lowered = {k.lower(): k for k in _load_all()}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.4)
    return [lowered[c] for c in close]


def get(name: str) -> ModelEntry:
    """The entry named `name` (case-insensitive); UnknownModelError with suggestions otherwise."""
    table = _load_all()
    if name in table:
        return table[name]
    for key, entry in table.items():
        if key.lower() == name.lower():
            return entry
    raise UnknownModelError(name, suggest(name))


def head_dim(cfg: Mapping[str, Any]) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def layer_params(cfg: Mapping[str, Any]) -> int:
    """Parameters of one decoder layer."""
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], head_dim(cfg)
    q_out = cfg["num_attention_heads"] * hd
    kv_out = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
    family = cfg["model_type"]
    attn = h * q_out + 2 * h * kv_out + q_out * h  # q, k, v, o (Phi-3's fused qkv has the same count)
    if family in _QKV_BIAS_FAMILIES:
        attn += q_out + 2 * kv_out
    elif cfg.get("attention_bias"):
        attn += q_out + 2 * kv_out + h
    if family in _QK_NORM_FAMILIES:
        attn += 2 * hd
    elif family in _FULL_QK_NORM_FAMILIES:
        attn += q_out + kv_out
    mlp = 3 * h * inter  # gate, up, down (Phi-3's fused gate_up has the same count)
    if cfg.get("mlp_bias"):
        mlp += 2 * inter + h
    norms = (4 if family in _FOUR_NORM_FAMILIES else 2) * h
    return attn + mlp + norms


def param_count(cfg: Mapping[str, Any]) -> int:
    """All parameters of the model: embedding + layers + final norm (+ lm_head when untied)."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    lm_head = 0 if cfg.get("tie_word_embeddings", True) else vocab * h
    return vocab * h + cfg["num_hidden_layers"] * layer_params(cfg) + h + lm_head


def decode_params(cfg: Mapping[str, Any]) -> int:
    """Parameters read per decode step: all layers + final norm + lm_head (embedding row negligible)."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    return cfg["num_hidden_layers"] * layer_params(cfg) + h + vocab * h


def decode_bytes(cfg: Mapping[str, Any], dtype: str = "bf16") -> int:
    return decode_params(cfg) * DTYPE_BYTES[dtype]


def hf_config(cfg: Mapping[str, Any]):
    """A transformers config object for these facts (AutoConfig.for_model on the family's model_type)."""
    from transformers import AutoConfig

    facts = dict(cfg)
    model_type = facts.pop("model_type")
    return AutoConfig.for_model(model_type, **facts)
