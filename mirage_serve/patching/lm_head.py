"""The model's output projection (lm_head) as a site: the GEMV over the vocabulary that ends a decode step.

    path = find_lm_head(model)   # "lm_head", or None

On a decode step it is cuBLAS's GEMV, the one large launch of the step that is not a dependent launch: H100 traces
show a 5.3–5.6 µs gap before it on every model profiled, where the site kernels around it start early
(benchmarks/results/floor_h100_2026-11-28_s36/README.md, section 2). As a site it is the program ``x -> W x``,
searched, verified and launched like a layer's projection (``ProjSite``), so it is launched with dependent launch
too. Its output, the logits, leaves the model: outside CUDA-graph capture it is handed out as a copy
(``ProjSite.escapes``), as a site kernel reuses its output buffer.

Found through HF's own interface for it, ``get_output_embeddings()``, and checked on one decode-shaped forward:
a Linear, called once, returning a tensor as wide as the logits the model returns (else the model is left as it
is). Logits transformed after the projection (Gemma-2's final softcap) pass that check; the transformation stays in
the model's forward, after the kernel. By default (``PatchOptions.lm_head == "cached"``) it runs only at the batch
buckets a kernel cache entry holds and is never searched: alternated H200 runs measured 0.5-4% faster steps at b1 and
the same at b8, but a cold search costs 62.6 s a bucket for Llama-3.1-8B on an H100. docs/architecture.md, "The output
projection".
"""
from __future__ import annotations

import torch
from torch import nn

from .sites import ProjSite

NAME = "lm_head"


def site(path: str) -> ProjSite:
    """The output projection at ``path`` (relative to the model) as a site; its logits leave the model."""
    return ProjSite(NAME, path, escapes=True)


def find_lm_head(model: nn.Module) -> str | None:
    """The path of the model's output projection, or None (no such Linear, or a forward that cannot run on one
    token). Runs one forward of ``model`` on one token, no gradients."""
    path = output_linear(model)
    return path if path is not None and gives_the_logits(model, path) else None


def output_linear(model: nn.Module) -> str | None:
    """The path of the Linear HF names the model's output embeddings, or None; no forward (``gives_the_logits``
    checks the data flow)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear):
        return None
    return next((p for p, m in model.named_modules() if m is head and p), None)


def gives_the_logits(model: nn.Module, path: str) -> bool:
    """Whether the Linear at ``path`` is called once in a forward of ``model`` on one token and returns a tensor as
    wide as the logits the model returns (one forward, no gradients; a forward that cannot run here: False)."""
    head = model.get_submodule(path)
    calls: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, out: calls.append(out))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.ones(1, 1, dtype=torch.long, device=head.weight.device), use_cache=True)
    except Exception:  # a forward that cannot run here leaves the projection as it is
        return False
    finally:
        handle.remove()
    logits = getattr(out, "logits", None)
    return len(calls) == 1 and isinstance(logits, torch.Tensor) and calls[0].shape[-1] == logits.shape[-1]
