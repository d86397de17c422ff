"""patch(model) / unpatch(model): swap a Hugging Face decoder's blocks for superoptimized kernels.

    report = mirage_serve.patch(model)           # before model.generate(...)
    print(report)                                 # every site: patched or not, and why
    mirage_serve.unpatch(model)                   # the model exactly as it was

The stages, in order, each timed into ``PatchReport.stages`` (docs/architecture.md): **sites** (the
family adapter, or the partition of the traced layer) → **residual plan** (``residual``) →
**prepare**, per layer and site (``prepare``: extract the Lax program by tracing the modules,
choose a μGraph from the cache or the search, verify, build for the backend, numeric self-check
against the original modules) → **install** every prepared site at once (``install``) → decode
**attention** → decode **graphs**. A site that fails any stage stays original; an error while
installing undoes every swap, so the model is never left half patched.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch

from superopt.runtime.interpreter import interpreting

from .. import backends, optimize
from ..options import PatchOptions
from . import final_norm, lm_head
from .prepare import Preparer, SiteError
from .handoff import ResidualSlot
from .residual import FusedAdd, LayerPlan, plan_residual_adds
from .install import Record, install, restore, set_forward
from ..report import PatchReport, SiteReport
from .sites import ProjSite, find_layers

__all__ = ["PatchError", "patch", "unpatch", "is_patched"]

_CPU_NOTE = ("backend torch: μGraphs run in the torch interpreter; this is for testing the patch "
             "path on CPU and gives no speed-up")

_RESIDUAL_NOTE = ("residual adds: in the kernels of {projs} in {n}/{of} layers (found from the traced layer, "
                  "handed the residual by the layer's forward, PatchOptions.fused_residual)")
_TRACED_NOTE = ("sites from the traced decoder layer (no adapter for model type {!r}): norm → projections "
                "and projections alone")
_LM_HEAD_NOTE = ("lm_head: {where}; PatchOptions(lm_head='search') or MIRAGE_SERVE_LM_HEAD=search searches "
                 "the buckets the kernel cache lacks, about a minute each at 8B, and `mirage-serve warm` keeps them")
_GRAPHS_NOTE = ("decode steps replay CUDA graphs on an owned static KV cache; HF's auto-compile is "
                "off for this model (it would compile around the graphs)")

# model -> the records patch() made; weak, so a patched model can still be garbage-collected.
_PATCHED: "weakref.WeakKeyDictionary[torch.nn.Module, list[Record]]" = weakref.WeakKeyDictionary()


class PatchError(ValueError):
    """patch() refused the model; it was left untouched."""


def is_patched(model: torch.nn.Module) -> bool:
    return model in _PATCHED


def _check_model(model) -> tuple[torch.device, torch.dtype]:
    if not isinstance(model, torch.nn.Module):
        raise PatchError(f"patch() takes a torch.nn.Module, got {type(model).__name__}")
    if model in _PATCHED:
        raise PatchError("model is already patched; call mirage_serve.unpatch(model) first")
    tensors = list(model.parameters()) + list(model.buffers())
    if not tensors:
        raise PatchError("model has no parameters")
    if any(t.is_meta for t in tensors):
        raise PatchError("model has tensors on the meta device (weights not loaded); load or "
                         "materialise the weights before patch()")
    if model.training:
        raise PatchError("model is in training mode; patch() is for inference: call model.eval() "
                         "first (backward through compiled kernels is not supported)")
    dtypes = {t.dtype for t in model.parameters() if t.is_floating_point()}
    dtype = getattr(model, "dtype", None) or next(iter(dtypes))
    return tensors[0].device, dtype


def _buckets(batch_sizes: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(b) for b in batch_sizes}))
    except (TypeError, ValueError):
        raise PatchError(f"batch_sizes must be positive integers, got {batch_sizes!r}") from None
    if not out or out[0] < 1:
        raise PatchError(f"batch_sizes must be positive integers, got {batch_sizes!r}")
    return out


def _adapters():
    """``mirage_serve.patches`` (the ``patches/`` folder), also from a source checkout on PYTHONPATH."""
    try:
        from .. import patches
    except ImportError:
        # No package-dir mapping without an install (the GPU machine): load the folder beside
        # mirage_serve/ under its installed name, so adapters import as mirage_serve.patches.*.
        import importlib.util
        import sys
        from pathlib import Path

        init = Path(__file__).resolve().parents[2] / "patches" / "__init__.py"  # beside mirage_serve/
        spec = importlib.util.spec_from_file_location("mirage_serve.patches", init,
                                                      submodule_search_locations=[str(init.parent)])
        patches = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = patches
        spec.loader.exec_module(patches)
    return patches.family_for, patches.supported_model_types


def _open_cache(cache_dir, report: PatchReport):
    """The kernel cache (mirage_serve.cache): ``cache_dir`` or the default user cache, layered over
    the shipped ``kernels_cache/``. Opened even without a search: its entries still serve searched
    μGraphs and their binaries."""
    try:
        from ..cache import KernelCache
        return KernelCache(cache_dir)
    except Exception as e:  # an unusable cache slows patch() down but must not stop it
        _note(report, f"kernel cache unavailable: {e}")
        return None


def patch(model: torch.nn.Module, *, backend: str = "auto", cache_dir=None, search_budget=None,
          batch_sizes: Sequence[int] = (1, 2, 4, 8, 16), strict: bool = False,
          cuda_graphs: bool | None = None, decode_attention: bool | None = None,
          options: PatchOptions | None = None) -> PatchReport:
    """Patch ``model`` in place for decoding; returns a report of every site.

    ``batch_sizes``: the decode buckets (tokens per forward call, batch × new tokens); inputs with
    more rows (prefill) run the original modules. ``search_budget``: passed to the search
    (``0`` skips it and runs each extracted program as it is). ``strict``: raise instead of
    reporting when the model's family is not supported. ``cuda_graphs`` (default: on for CUDA
    models): generate() decodes on an owned static KV cache with each step replayed from a CUDA
    graph (``mirage_serve.decode``); HF's auto-compile is turned off for the patched model.
    ``decode_attention`` (default: on for CUDA models): decode steps on a static KV cache run
    RoPE, the cache write and attention as the searched μGraph of the step's attention program, or the
    hand-written reference kernels where the GPU profile times them faster (``PatchOptions.attention``,
    ``mirage_serve.decode.attention_searched``).
    ``options``: the behaviour switches (``PatchOptions``: dependent launch, paired k/v launch, fused
    residual adds, research mode); left out, each takes its default from ``mirage_serve.knobs``.
    """
    t0 = time.perf_counter()
    call = _resolve(model, backend, options, cuda_graphs, decode_attention, batch_sizes)
    report, stage = call.report, _Stages(call.report)
    found = _find_sites(model, call, strict)
    if found is None:
        return report
    family, layers_path, layers = found
    stage("sites")
    residual = _plan_residual(model, family, layers, call)
    stage("residual plan")
    cache = _open_cache(cache_dir, report)
    plans = _prepare_sites(model, family, layers_path, layers, residual, call, cache, search_budget)
    stage("prepare")
    _install(model, family, layers, residual, plans, call, stage, _attention_search(call, cache, search_budget))
    report.seconds = time.perf_counter() - t0
    return report


@dataclass
class _Call:
    """One patch() call's arguments, checked and resolved, and the report it fills."""

    device: torch.device
    dtype: torch.dtype
    backend: str
    buckets: tuple[int, ...]
    options: PatchOptions
    cuda_graphs: bool
    decode_attention: bool
    shard: object            # tensor parallel (mirage_serve.tp): None on one GPU
    report: PatchReport


def _resolve(model, backend, options, cuda_graphs, decode_attention, batch_sizes) -> _Call:
    """Check the model and the arguments (a ``PatchError`` before anything changes) and resolve the
    defaults."""
    device, dtype = _check_model(model)
    shard = _sharding(model)
    backend = backends.resolve(backend, device)
    if options is None:
        options = PatchOptions()
    elif not isinstance(options, PatchOptions):
        raise PatchError(f"options must be a mirage_serve.PatchOptions, got {type(options).__name__}")
    if cuda_graphs is None:
        cuda_graphs = device.type == "cuda"
    elif cuda_graphs and device.type != "cuda":
        raise PatchError(f"cuda_graphs=True needs a model on a CUDA device; this one is on {device}")
    if decode_attention is None:
        decode_attention = device.type == "cuda" or interpreting()  # Triton kernels on CPU tensors (tests)
    buckets = _buckets(batch_sizes)
    model_type = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    report = PatchReport(str(model_type), backend, str(device), str(dtype).replace("torch.", ""), buckets)
    report.deterministic = options.deterministic or backend == "torch"  # the interpreter sums blocks in order
    if backend == "torch":
        report.note = _CPU_NOTE
    return _Call(device, dtype, backend, buckets, options, cuda_graphs, decode_attention, shard, report)


def _note(report: PatchReport, *lines: str) -> None:
    report.note = "; ".join(x for x in (report.note, *lines) if x)


def _find_sites(model, call: _Call, strict: bool):
    """Stage "sites": (family, layer list path, layers) from the family's adapter, or from the
    partition of its traced decoder layer; None (the reason in the report) when there are none."""
    report, model_type = call.report, call.report.model_type
    family, traced = family_of(model, model_type)
    if traced is not None:
        _note(report, _TRACED_NOTE.format(model_type) if family else "")
    found = find_layers(model, family) if family else None
    if found is None:
        why = (f"model type {model_type!r} is not supported: no adapter (adapters: "
               f"{', '.join(_adapters()[1]())}) and {traced}" if family is None else
               f"no decoder layer list found at {' or '.join(family.layers)}")
        if strict:
            raise PatchError(why + "; the model was left unchanged")
        report.supported, report.note = False, why + "; the model was left unchanged"
        return None
    return (family, *found)


def family_of(model, model_type: str):
    """(family, None) from the model type's adapter; else (family or None, why not) from the partition
    of its traced decoder layer (patching.partition). The sites patch() would use."""
    family = _adapters()[0](model_type)
    if family is not None:
        return family, None
    from .partition import family_from_trace
    return family_from_trace(model, model_type)


def _plan_residual(model, family, layers, call: _Call) -> list[LayerPlan]:
    """Stage "residual plan": per layer, the residual adds that move into projection kernels."""
    residual, why_not = _residual_plans(model, family, layers) if call.options.fused_residual else \
        ([LayerPlan()] * len(layers), "residual adds stay in the layer (PatchOptions.fused_residual is off)")
    if call.shard:  # how the shards are patched (the residual: rank 0 adds it before the all-reduce)
        why_not = "; ".join(x for x in (why_not, call.shard.note()) if x)
    _note(call.report, "; ".join(f"{b}: {w}" for b, w in family.not_patched), why_not)
    return residual


def _attention_search(call: _Call, cache, search_budget):
    """The searched decode attention of this call (``decode.attention_searched``): its μGraphs are chosen on
    the first decode step of each shape, since the cache's capacity is known only then."""
    if not call.decode_attention:
        return None
    from ..decode.attention_searched import AttentionSearch
    return AttentionSearch(cache, optimize.default_budget(search_budget, call.backend), call.options.pdl,
                           call.options.attention, call.options.deterministic)


def _prepare_sites(model, family, layers_path, layers, residual, call: _Call, cache, search_budget) -> list:
    """Stage "prepare": every site of every layer, then the model's final norm (``final_norm``) and, where
    ``PatchOptions.lm_head`` asks, its output projection (``lm_head``),
    extracted, chosen, verified, built and self-checked (``prepare.Preparer``); returns (module the
    site's paths are relative to, site, runtime, SiteReport) of those ready. A site that fails stays
    original, with its reason in its SiteReport."""
    report, shard = call.report, call.shard
    # tensor parallel keeps the final norm original: the shards' sites are prepared on shard views
    final = None
    if call.options.final_norm and shard is None:
        final = final_norm.find_final_norm(model, layers_path, layers)

    def with_residual(i, site):  # the projection site takes its layer's residual add (patching.residual)
        return residual[i].site_for(site) if isinstance(site, ProjSite) else site

    # (layer, module, site, path prefix, buckets: None for the call's)
    jobs = [(i, layer, with_residual(i, site), f"{layers_path}.{i}.", None)
            for i, layer in enumerate(layers) for site in family.sites]
    if final:
        jobs.append((-1, model, final_norm.site(final), "", None))
    head = lm_head.output_linear(model) if call.options.lm_head != "off" and shard is None else None
    prep = Preparer(call.backend, call.dtype, call.buckets, search_budget, cache,
                    call.options, shard_tag=shard.tag if shard else "")
    plans = []
    try:
        if head:
            jobs += _lm_head_job(model, head, prep, call)
        # every unsigned cache entry's verification starts now, all programs at once (Preparer.prefetch)
        for _, module, site, _, _ in jobs if shard is None else ():
            prep.prefetch(module, site)
        for i, module, site, prefix, buckets in jobs:
            sr = SiteReport(i, site.name, tuple(prefix + p for p in site.paths()))
            report.sites.append(sr)
            try:
                if shard is None:
                    plans.append((module, site, prep.prepare(module, site, sr, buckets), sr))
                elif (why := shard.unsupported(module, site)) is not None:
                    sr.reason = why
                else:  # searched on this rank's shards; installed on the real layer
                    runtime = prep.prepare(shard.view(module), site, sr)
                    plans.append((module, site, shard.wrap(module, site, runtime), sr))
            except SiteError as e:
                sr.reason = str(e)
            except Exception as e:  # an unexpected failure of one site must not stop the others
                sr.reason = f"internal error: {type(e).__name__}: {e}"
    finally:
        prep.close()
        report.add_counts(prep.counts)
    if shard is not None:  # tensor parallel: install a site only where every rank prepared it
        plans = shard.agree(plans, report.sites)
    return plans


def _lm_head_job(model, path: str, prep: Preparer, call: _Call) -> list[tuple]:
    """The output projection's job for ``_prepare_sites``: at every bucket with ``PatchOptions.lm_head ==
    "search"``; with "cached", at the buckets a cache entry holds (none: no job, and a report note saying how to
    get one), so a first patch never pays its search (about a minute a bucket at 8B, docs/architecture.md). The
    one-token forward that checks the projection gives the logits (``lm_head.gives_the_logits``) runs only where
    the site would."""
    site = lm_head.site(path)
    buckets = None
    if call.options.lm_head == "cached":
        buckets = prep.cached_buckets(model, site)
        if not buckets:
            _note(call.report, _LM_HEAD_NOTE.format(where="cuBLAS (the kernel cache holds no kernel for it at "
                                                          "these buckets)"))
            return []
    if not lm_head.gives_the_logits(model, path):
        return []
    if buckets and max(buckets) < max(call.buckets):
        _note(call.report, _LM_HEAD_NOTE.format(where=f"a site kernel up to {max(buckets)} rows, cuBLAS above"))
    return [(-1, model, site, "", buckets)]


def _install(model, family, layers, residual, plans, call: _Call, stage, attention_search) -> None:
    """Stages "install" (every prepared site, and the layers' residual hand-off), "attention" and
    "graphs": all of them or none (a failure undoes every swap)."""
    report, shard = call.report, call.shard
    records: list[Record] = []
    try:
        slots: dict[int, tuple] = {}  # layer index -> (layer, {projection path: ResidualSlot})
        for layer, site, runtime, sr in plans:
            slot = None
            if getattr(site, "residual", False):
                slot = slots.setdefault(sr.layer, (layer, {}))[1].setdefault(
                    site.proj, ResidualSlot(layer.get_submodule(site.proj)))
            install(layer, site, runtime, records, slot)
            sr.patched = True
        for i, (layer, by_proj) in slots.items():  # the layer hands its residual to the projections
            set_forward(layer, residual[i].forward(layer, by_proj), records)
        if slots:
            projs = sorted({_fused_name(residual[i].fused_into(p)) for i, (_, by_proj) in slots.items()
                            for p in by_proj})
            _note(report, _RESIDUAL_NOTE.format(projs=", ".join(projs), n=len(slots), of=len(layers)))
        stage("install")
        if call.decode_attention:
            _install_attention(model, layers, records, report, attention_search,
                               shard.config if shard else model.config)
            stage("attention")
        if call.cuda_graphs:
            from ..decode import install_decode_graphs

            install_decode_graphs(model, config=shard.config if shard else None)
            stage("graphs")
    except BaseException:
        restore(records)
        for *_, sr in plans:
            sr.patched = False
        raise
    if call.cuda_graphs:
        report.cuda_graphs = True
        _note(report, _GRAPHS_NOTE)
    if records or call.cuda_graphs:
        _PATCHED[model] = records


class _Stages:
    """Times patch()'s stages into ``report.stages``: each call closes the stage that just ran."""

    def __init__(self, report: PatchReport):
        self.report, self.t = report, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.report.stages[name] = now - self.t
        self.t = now


def _sharding(model):
    """The model's tensor-parallel ``Sharding`` (HF's tp_plan over torch.distributed), or None;
    a world size that does not split the heads evenly is refused before anything changes."""
    from ..tp.shards import divides, sharding_of

    shard = sharding_of(model)
    if shard is not None and not shard.simulated:
        why = divides(model.config, shard.world)
        if why:
            raise PatchError(why + "; the model was left unchanged")
    return shard


def _fused_name(f: FusedAdd) -> str:
    """A projection with its residual add, as the report names it: ``o_proj (+ post_norm)``, ``o_proj (× 0.22)``."""
    if f.post:
        return f"{f.proj} (+ {f.post})"
    if f.scale:
        return f"{f.proj} ({'×' if f.scale[1] == 'mul' else '÷'} {f.scale[2]:g})"
    return f.proj


def _residual_plans(model, family, layers) -> tuple[list[LayerPlan], str]:
    """Per layer, which residual adds move into which projection's kernel (``patching.residual``,
    from one traced decode-shaped forward), and what stays in the layer and why (for the report)."""
    candidates = [s.proj for s in family.sites if isinstance(s, ProjSite) and s.tail is None]
    plans = plan_residual_adds(model, layers, candidates) if candidates else "the family has no projection site"
    if isinstance(plans, str):
        return [LayerPlan()] * len(layers), f"residual adds stay in the layer ({plans})"
    why: dict[str, str] = {}
    for plan in plans:
        for what, reason in plan.why_not.items():
            why.setdefault(what, reason)
    return plans, "; ".join(f"{what} stays in the layer ({reason})" for what, reason in why.items())


def _install_attention(model, layers, records: list[Record], report: PatchReport, search, config) -> None:
    """Decode attention on each layer's child the fast path recognises (``find_attention``), whatever
    the family; each module is then checked against its own forward on first use."""
    from ..decode.attention_fast import find_attention, install_fast_attention

    attn_name = find_attention(layers[0], config)
    if attn_name is None:
        _note(report, "decode attention: no module of the decoder layer has what the kernels take (q/k/v or qkv "
                      "and o projections, head_dim, scaling, layer_idx); the model's own attention runs")
        return
    fast = install_fast_attention(layers, attn_name, config, records, search.pdl, search)
    normed = sum(f.qk_norm is not None for f in fast.values())
    kernels = {"profiled": "the searched μGraph of each shape, or the hand-written reference kernels where "
                           "the GPU profile times them faster",
               "searched": "the searched μGraph of each shape", "hand-written": "the hand-written reference kernels"}
    note = (f"decode attention: {len(fast)}/{len(layers)} layers run "
            f"{f'q/k RMSNorm ({normed} layers) + ' if normed else ''}RoPE + cache write + attention on static "
            f"KV caches as {kernels[search.mode]} (chosen on the first decode step of each shape: "
            f"mirage_serve.attention_kernels(model); each module checked against its own forward on first "
            f"use); other calls stay original")
    _note(report, note)


def unpatch(model: torch.nn.Module) -> bool:
    """Restore every forward patch() replaced; returns False if the model was not patched."""
    records = _PATCHED.pop(model, None)
    if records is None:
        return False
    from ..decode import uninstall_decode_graphs

    uninstall_decode_graphs(model)
    restore(records)
    return True
