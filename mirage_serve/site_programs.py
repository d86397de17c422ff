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


def layer_programs(name: str, rows: tuple[int, ...]) -> Iterator[tuple[str, int, KernelGraph]]:
    """(site program label, rows, program) for every site part of one layer of registry model
    ``name`` at each row count (a label can repeat: k and v share one)."""
    from transformers import AutoModelForCausalLM

    from superopt.lax.extract import extract
    from superopt.lax.rows import with_rows

    from . import registry
    from .patch_api import _adapters
    from .patch_prepare import _dim
    from .sites import find_layers, site_module, site_parts

    facts = dict(registry.get(name).config, num_hidden_layers=1)
    facts["vocab_size"] = max(128, (facts.get("pad_token_id") or 0) + 1)  # small, but holding the pad id
    if facts.get("layer_types"):
        facts["layer_types"] = facts["layer_types"][:1]
    cfg = registry.hf_config(facts)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    family = _adapters()[0](cfg.model_type)
    _, layers = find_layers(model, family)
    top = max(rows)
    for site in family.sites:
        for label, part, _ in site_parts(site.name, site_module(layers[0], site)):
            x = torch.randn(top, _dim(part.head), dtype=torch.bfloat16)  # the site's own input size
            ex = extract(part, (x,), f"{label}_m{top}")
            rows_input = next(v.name for v, src in zip(ex.graph.inputs, ex.sources) if src[0] == "arg")
            for m in rows:
                yield label, m, ex.graph if m == top else with_rows(ex.graph, rows_input, m, f"{label}_m{m}")
