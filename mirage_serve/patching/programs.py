"""The site programs ``patch()`` extracts from a decoder layer of a registry model, without weights.

    for label, rows, program in layer_programs("Llama-3.1-8B", (1, 8)): ...

One layer with a small vocabulary is built from the registry's config (random weights: a program
depends on shapes and structure only); each site part (``sites.site_parts``) is traced at the
largest row count and re-typed for the others, as ``Preparer`` does. For the tools that reason
about programs without a model: which ones the shipped cache covers, what the search offers the
GPU profiler (``benchmarks/shipped_coverage.py``, ``benchmarks/search_candidates.py``).
"""
from __future__ import annotations

from typing import Iterator

import torch

from superopt.ir import KernelGraph


def layer_programs(name: str, rows: tuple[int, ...], fused_residual: bool | None = None,
                   stacked: bool | None = None) -> Iterator[tuple[str, int, KernelGraph]]:
    """(site program label, rows, program) for every site part of one layer of registry model
    ``name``, and of its final norm (``final_norm``), at each row count (a label can repeat: k and v
    share one; the final norm is the layers' "norm"). ``fused_residual`` (default:
    ``PatchOptions().fused_residual``): the projections with the layer's residual add, where
    ``patch()`` would fuse it (``patching.residual``). ``stacked`` (default:
    ``PatchOptions().stacked_projections``): q/k/v as one stacked projection (``patching.stacking``)."""
    from transformers import AutoModelForCausalLM

    from superopt.lax.extract import extract
    from superopt.lax.rows import with_rows

    from .. import registry
    from ..options import PatchOptions
    from .pipeline import _adapters, _residual_plans
    from .prepare import activation_dims
    from . import final_norm
    from .sites import ProjSite, find_layers, site_module, site_parts

    facts = dict(registry.get(name).config, num_hidden_layers=1)
    facts["vocab_size"] = max(128, (facts.get("pad_token_id") or 0) + 1)  # small, but holding the pad id
    if facts.get("layer_types"):
        facts["layer_types"] = facts["layer_types"][:1]
    cfg = registry.hf_config(facts)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    family = _adapters()[0](cfg.model_type)
    if family is None:  # no adapter: the sites patch() would take from the traced layer
        from .partition import family_from_trace
        family, why = family_from_trace(model, cfg.model_type)
        if family is None:
            raise ValueError(f"{name}: {why}")
    path, layers = find_layers(model, family)
    defaults = PatchOptions()
    fused = defaults.fused_residual if fused_residual is None else fused_residual
    stack = defaults.stacked_projections if stacked is None else stacked
    plan = _residual_plans(model, family, layers)[0][0] if fused else None
    top = max(rows)
    parts = []
    for site in family.sites:
        if plan is not None and isinstance(site, ProjSite):
            site = plan.site_for(site)  # with the layer's residual add (and its post-norm or scale)
        parts += site_parts(site.name, site_module(layers[0], site), stack)
    final = final_norm.find_final_norm(model, path, layers) if defaults.final_norm else None
    if final:  # the model's final norm, a site outside the layers (the program "norm" where it matches the layers')
        parts += site_parts(final_norm.NAME, site_module(model, final_norm.site(final)), stack)
    for label, part, _ in parts:
        acts = tuple(torch.randn(top, d, dtype=torch.bfloat16) for d in activation_dims(part))
        ex = extract(part, acts, f"{label}_m{top}")
        rows_inputs = [v.name for v, src in zip(ex.graph.inputs, ex.sources) if src[0] == "arg"]
        for m in rows:
            yield label, m, ex.graph if m == top else with_rows(ex.graph, rows_inputs, m, f"{label}_m{m}")
