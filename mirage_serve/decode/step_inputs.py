"""A decode step's inputs without HF's per-step preparation, where that preparation only hands back the loop's own
buffers.

HF's ``prepare_inputs_for_generation`` runs inside every captured decode step. For a plain decoder it returns the
loop's own buffers (the cache, the position ids, the step mask) and one tensor of its own: ``input_ids`` cloned for
a consistent stride. That clone is a device copy, the step's first node: in H200 traces 1.2 µs and a 0.4 µs gap,
every model profiled (benchmarks/results/floor_h200_2026-11-28_s39/README.md, section 3). The model's embedding
then gathers the token's row, a launch of its own (2.4 µs and a gap).

``direct_inputs`` checks one dict that preparation returned for the arguments of the loop's later steps. Where
every tensor in it is a buffer the loop passed in, or the clone of its ids, the loop passes that dict from then on
with the ids buffer itself in place of the clone. Where the greedy kernels also write the next token's embedding
row into a buffer (``embedding_weight``: a plain row gather), ``inputs_embeds`` replaces ``input_ids``, as HF's own
first step passes embeddings. Anything else keeps HF's preparation every step: a model whose preparation makes
tensors of its own (per-layer-type mask dicts, multimodal position ids, token types).
"""
from __future__ import annotations

from typing import Iterable

import torch


def embedding_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The weight of the model's input embedding where its forward is exactly a row gather of a plain tensor: a
    plain ``nn.Embedding`` (not a subclass: Gemma-3's scales its rows) without ``max_norm`` (which renormalises rows
    in place), whose weight is no tensor subclass (a tensor-parallel shard's DTensor has no storage a kernel can
    read); else None."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if type(emb) is not torch.nn.Embedding or emb.max_norm is not None:
        return None
    if type(emb.weight) not in (torch.nn.Parameter, torch.Tensor):
        return None
    return emb.weight


def _holds_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def direct_inputs(prepared: dict, ids: torch.Tensor, passed: Iterable[torch.Tensor],
                  embeds: torch.Tensor | None = None) -> dict | None:
    """The dict to pass in place of ``prepared`` on every later step, or None where ``prepared`` holds a tensor
    that is neither one of ``passed`` (by identity) nor a copy of ``ids`` under ``input_ids``. ``embeds``: a buffer
    holding the embedding rows of ``ids``, passed as ``inputs_embeds`` instead of ``input_ids``."""
    own = {id(t) for t in passed}
    out = {}
    for key, value in prepared.items():
        if key == "input_ids":
            same = (isinstance(value, torch.Tensor) and value.shape == ids.shape and value.dtype == ids.dtype
                    and torch.equal(value, ids))
            if not same:
                return None
            out[key] = ids
        elif isinstance(value, torch.Tensor):
            if id(value) not in own:
                return None
            out[key] = value
        elif _holds_tensor(value):
            return None
        else:  # the cache object, flags, counts
            out[key] = value
    if "input_ids" not in out or out.get("inputs_embeds") is not None:
        return None
    if embeds is not None:
        out["input_ids"], out["inputs_embeds"] = None, embeds
    return out
