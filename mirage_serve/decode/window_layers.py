"""Sliding-window KV cache layers inside captured decode steps (Gemma-2/3 hybrids, Phi-3).

HF's ``StaticSlidingWindowLayer`` keeps its length twice: a device tensor (``cumulative_length``,
which its writes index with) and a Python int (``cumulative_length_int``, which picks the branch of
``update``, the mask sizes and ``get_seq_length``). Until the window is full, ``update`` writes at
the tensor's position and the mask sizes are a plain static layer's (offset 0, the window's length),
so a captured step's cache writes replay exactly (its mask does not: below). Once full it rolls the
window and the mask offset moves with every token, which a graph cannot follow: a step is replayed
only while every sliding layer has room for it (``replayable``); later steps run eagerly, through
HF's code.

HF builds a sliding layer's mask with the query at the layer's *host* length (``get_seq_length`` is
``cumulative_length_int``: masking_utils' ``q_offset``), so a captured step's mask keeps the capture's
bound and every replay masks the tokens written since (transformers 5.17 and 5.24 alike). The
decode-attention kernels read the mask through ``lift_causal_bound``, which removes that bound; HF's
own attention on a sliding layer inside a replayed step would still read the stale mask, so a decode
loop whose sliding layers are not all served by the kernels is not captured (``frozen_mask_layers``).

A replay advances the tensor but not the int, and a capture advances the int but not the tensor
(it records without running), so the owner of the graph keeps the int in step on the host
(``advance``), with no device sync. Layers of any other kind (or a release whose sliding layer does
not keep both lengths) keep HF's loop.
"""
from __future__ import annotations

import torch
from transformers import cache_utils

_STATIC = cache_utils.StaticLayer
_SLIDING = getattr(cache_utils, "StaticSlidingWindowLayer", None)


def sliding(layer) -> bool:
    """A sliding layer that keeps its length both on the device and on the host (see above)."""
    return (_SLIDING is not None and type(layer) is _SLIDING
            and isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
            and isinstance(getattr(layer, "cumulative_length_int", None), int))


def why_not_graphable(cache, total_length: int) -> str | None:
    """Why a decode loop generating up to ``total_length`` tokens (prompt included) on ``cache``
    cannot run as captured steps (None: it can; sliding layers' steps past their window then run
    eagerly)."""
    for layer in cache.layers:
        if sliding(layer):
            continue
        if type(layer) is not _STATIC:
            return f"cache layer {type(layer).__name__}"
        if total_length > layer.max_cache_len:
            return "cache shorter than max_length"  # the runner sizes it; a caller's config may not
    return None


def sliding_layers(cache) -> list:
    """The sliding layers of ``cache`` (or of none): the ones ``replayable`` and ``advance`` need look at
    (a static layer is always replayable and keeps no host length), listed once by a graph's owner."""
    return [layer for layer in getattr(cache, "layers", ()) if sliding(layer)]


def replayable(layers, new_tokens: int = 1) -> bool:
    """Whether a step writing ``new_tokens`` leaves every sliding layer among ``layers`` short of full."""
    return all(layer_replayable(layer, new_tokens) for layer in layers)


def layer_replayable(layer, new_tokens: int = 1) -> bool:
    """Whether one cache layer is static, or sliding with room for ``new_tokens`` more (see above)."""
    return type(layer) is _STATIC or (sliding(layer) and layer.cumulative_length_int + new_tokens <= layer.max_cache_len)


def frozen_mask_layers(cache, kernel_layers: set[int]) -> list[int]:
    """The sliding layers of ``cache`` whose attention is not among ``kernel_layers`` (the decode-attention
    kernels'): HF's attention would read their mask as a capture froze it (see above)."""
    return [i for i, layer in enumerate(getattr(cache, "layers", ())) if sliding(layer) and i not in kernel_layers]


def advance(layers, tokens: int) -> None:
    """Move the host length of every sliding layer among ``layers`` by ``tokens``: what ``tokens``
    replays wrote on the device (or, negative, what a capture counted without writing)."""
    for layer in layers:
        advance_layer(layer, tokens)


def resync(layers) -> None:
    """Set every sliding layer's host length from its device tensor (one sync each): after a capture
    that failed part-way, when what the host counted is unknown."""
    for layer in layers:
        if sliding(layer):
            layer.cumulative_length_int = int(layer.cumulative_length)


def advance_layer(layer, tokens: int) -> None:
    """``advance`` for one layer: what a kernel that wrote ``tokens`` itself (not through HF's
    ``update``) leaves for the host to count. A no-op on static layers."""
    if sliding(layer):
        layer.cumulative_length_int += tokens


class _Lifted:
    """The last mask ``lift_causal_bound`` lifted: the sliding layers of one forward share one mask object
    and one host length, so the lift runs once a step (two small kernels), not once a layer."""
    mask = host = lifted = None


def lift_causal_bound(mask: torch.Tensor, layer) -> torch.Tensor:
    """A sliding layer's 4D decode mask [b or 1, 1, 1, window] as the [b or 1, window] the decode-attention
    kernels read, with every slot from the layer's host length on set to attend.

    While the window is not full (the only time the kernels run on it: ``layer_replayable``), slot i
    holds position i, so the slots from the host length on hold tokens generated after HF built the
    mask (the prompt and its padding lie before it); the kernel stops at the current slot itself.
    Eagerly the host length is the current slot, and nothing changes. Inside a captured step it is the
    capture's, frozen like HF's bound, and the lift then covers what the replays write: without it
    Gemma-3-1B's graphed logits went from 1.8e-2 relative error (bf16's own) at the first replay to
    0.17, 0.29, 0.36 at the next three (H100, ``benchmarks/diagnose_greedy.py``), and greedy tokens
    flipped at batch 8."""
    host = layer.cumulative_length_int
    if _Lifted.mask is mask and _Lifted.host == host:
        return _Lifted.lifted
    later = torch.arange(mask.shape[-1], device=mask.device) >= host  # [window]
    flat = mask[:, 0, 0, :]
    lifted = flat | later if flat.dtype == torch.bool else flat.masked_fill(later, 0.0)
    _Lifted.mask, _Lifted.host, _Lifted.lifted = mask, host, lifted
    return lifted
