"""`mirage-serve warm`'s back end: fill a kernel cache for a model ahead of time (deployment images).

Builds the model's architecture with random weights (weights never affect which kernel wins:
search, verification and profiling depend on shapes and dtypes only), then runs the ordinary
``mirage_serve.patch`` machinery on it with the cache directory and batch buckets given, so every
site is searched, verified, compiled, profiled and written to the cache exactly as a user's first
``patch`` would. The model is thrown away afterwards.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import knobs, registry
from .store import KernelCache, default_cache_dir

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)

# progress(message, done, total): called before each stage.
Progress = Callable[[str, int, int], None]


@dataclass
class WarmResult:
    model: str
    dtype: str
    batch_sizes: tuple[int, ...]
    cache_dir: Path
    seconds: float
    entries_before: int
    entries_after: int
    report: Any                    # the PatchReport patch() returned
    # the decode attention chosen ahead (``cache_lengths``): "batch b, cache L" -> what runs, or why none ran
    attention: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """What was built and where: model, dtype, buckets, device and backend; the cache directory
        with its new and total entries; patch()'s counts and every site it left unpatched."""
        built = f"{self.dtype} kernels for batch buckets {','.join(map(str, self.batch_sizes))}"
        if hasattr(self.report, "device"):
            built += f" on {self.report.device}, backend {self.report.backend}"
        text = (f"warmed {self.model} in {self.seconds:.1f} s: {built}\n"
                f"  cache {self.cache_dir}: {self.entries_after - self.entries_before} new entries, "
                f"{self.entries_after} in all")
        if not hasattr(self.report, "counts"):  # no PatchReport (a stand-in patch)
            return text
        # programs shared with a model warmed before are cache hits, not new entries: say so
        text += f"\n  {self.report.counts()}"
        text += "".join(f"\n  decode attention, {shape}: {what}" for shape, what in self.attention.items())
        return text + "".join(f"\n  not patched: layer {s.layer} {s.site}: {s.reason}"
                              for s in self.report.sites if not s.patched)


def resolve_config(model_name_or_config) -> tuple[str, Any]:
    """(display name, transformers config) for a registry name or hub id, a config.json path
    (file or folder), a dict of config facts (optionally wrapped as a registry entry), or a config object."""

    m = model_name_or_config
    if isinstance(m, Mapping):
        facts = m.get("config", m)
        return str(m.get("name", facts.get("model_type", "model"))), registry.hf_config(facts)
    if isinstance(m, (str, Path)):
        p = Path(m).expanduser()
        if p.is_dir():
            p = p / "config.json"
        if p.suffix == ".json" and p.is_file():
            name, cfg = resolve_config(json.loads(p.read_text()))
            return (p.parent.name if name == cfg.model_type else name), cfg
        by_hub = [e for e in registry.entries() if e.hub_id.lower() == str(m).lower()]
        entry = by_hub[0] if by_hub else registry.get(str(m))   # else UnknownModelError, with hints
        return entry.name, registry.hf_config(entry.config)
    if hasattr(m, "model_type") and hasattr(m, "to_dict"):
        return str(getattr(m, "name_or_path", "") or m.model_type), m
    raise TypeError(f"warm_model: cannot make a model config from {type(m).__name__}")


def build_model(config, dtype: str, device=None):
    """The architecture with random weights N(0, 0.02), eval mode, on `device` (CUDA if present)."""
    import torch
    from transformers import AutoModelForCausalLM

    tdtype = registry.torch_dtype(dtype)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=tdtype)
    # from_config under a device context may leave memory uninitialised (docs/measuring.md); the numeric
    # checks inside patch() need finite weights.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model.eval()


def _call_patch(model, *, backend, cache_dir, batch_sizes):
    from ..options import PatchOptions
    from ..patching.pipeline import patch  # torch and transformers: loaded when a warm runs

    # warming pays the searches ahead of time, the output projection's too: a patch() takes that one only
    # from the cache by default (PatchOptions.lm_head "cached"); MIRAGE_SERVE_LM_HEAD, where set, still decides
    lm_head = knobs.LM_HEAD.get() if knobs.LM_HEAD.is_set() else "search"
    kwargs = {"cache_dir": cache_dir, "batch_sizes": batch_sizes, "options": PatchOptions(lm_head=lm_head)}
    if backend is not None:
        kwargs["backend"] = backend
    return patch(model, **kwargs)


def _count(cache_dir: Path) -> int:
    return sum(i.ok for i in KernelCache(cache_dir, shipped_dir=False, read_only=True).ls(("user",)))


def warm_model(model_name_or_config, batch_sizes=DEFAULT_BATCH_SIZES, dtype: str = "bf16",
               cache_dir=None, progress: Progress | None = None, *, backend: str | None = None,
               device=None, num_layers: int | None = None, cache_lengths=()) -> WarmResult:
    """Search, verify, compile and profile every site of a model into `cache_dir` ahead of time.

    `num_layers` builds fewer decoder layers (every layer of a family has the same shapes, so
    the same cache keys); None keeps the model's own count. `cache_lengths`: KV-cache lengths (prompt
    + new tokens) a deployment will generate with; the decode attention of each, at every batch size,
    is chosen here (``choose_attention``) instead of on a user's first decode step."""
    batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
    if not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive, got {batch_sizes}")
    lengths = cache_capacities(cache_lengths)
    cache_dir = default_cache_dir(cache_dir)
    note = progress or (lambda msg, done, total: None)
    t0 = time.perf_counter()

    note("resolving config", 0, 3)
    name, config = resolve_config(model_name_or_config)
    if num_layers is not None:
        config.num_hidden_layers = int(num_layers)
        if getattr(config, "layer_types", None):    # per-layer attention kinds must match count
            config.layer_types = config.layer_types[:int(num_layers)]
    before = _count(cache_dir)
    note(f"building {name} with random weights", 1, 3)
    model = build_model(config, dtype, device)
    note(f"patching {name}: search, verify, compile, profile", 2, 3)
    attention: dict[str, str] = {}
    try:
        report = _call_patch(model, backend=backend, cache_dir=cache_dir,
                             batch_sizes=batch_sizes)
        if lengths:
            attention = choose_attention(model, batch_sizes, lengths, note)
    finally:
        del model
        _free_device_memory()
    result = WarmResult(name, dtype, batch_sizes, cache_dir, time.perf_counter() - t0,
                        before, _count(cache_dir), report, attention)
    note(f"done in {result.seconds:.1f} s", 3, 3)  # the caller prints result.summary() once
    return result


def cache_capacities(lengths) -> tuple[int, ...]:
    """The KV-cache capacities ``generate()`` allocates for these lengths (prompt + new tokens): rounded up to
    ``decode.cache_pool.LENGTH_QUANTUM``, as the decode runner's cache pool does; distinct, ascending."""
    from ..decode.cache_pool import LENGTH_QUANTUM

    lengths = [int(n) for n in lengths]
    if any(n < 3 for n in lengths):
        raise ValueError(f"cache lengths are prompt + new tokens, at least 3; got {lengths}")
    return tuple(sorted({-(-n // LENGTH_QUANTUM) * LENGTH_QUANTUM for n in lengths}))


def choose_attention(model, batch_sizes, capacities, note: Progress, gpu: bool | None = None) -> dict[str, str]:
    """Choose the decode attention of each (batch, cache capacity) shape now, as a user's first decode step
    would (``decode.attention_searched``: the search or a stored structure, timed against the reference), by
    one 2-token ``generate()`` whose prompt fills the cache to that capacity; the choice goes to the kernel
    cache. On a CPU (``gpu``: by default, where the model is) there is nothing to choose (decode attention runs
    on a GPU), and each shape says so."""
    import torch

    from ..decode.attention_fast import attention_kernels

    shapes = [(b, n) for b in batch_sizes for n in capacities]
    device = next(model.parameters()).device
    if not (device.type == "cuda" if gpu is None else gpu):
        return {f"batch {b}, cache {n}": "not chosen: decode attention runs on a GPU" for b, n in shapes}
    out = {}
    vocab = model.config.vocab_size
    for i, (b, n) in enumerate(shapes):
        note(f"choosing the decode attention for batch {b}, cache {n}", i, len(shapes))
        ids = torch.randint(1, vocab, (b, n - 2), device=device, generator=torch.Generator(device).manual_seed(i))
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                           do_sample=False, pad_token_id=0)
        kinds = sorted(set(attention_kernels(model).values()))
        out[f"batch {b}, cache {n}"] = "; ".join(kinds) or "no attention module took the decode-attention kernels"
    return out


def _free_device_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
