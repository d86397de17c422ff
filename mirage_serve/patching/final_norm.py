"""The model's final norm: the norm a decoder applies to its last layer's output, before lm_head.

    path = find_final_norm(model, "model.layers", layers)   # "model.norm", or None

It sits outside the decoder layers, so the layer sites never see it, and on a decode step it would
otherwise run as the norm module's own torch ops (about six launches for an RMSNorm: cast, square,
mean, rsqrt, two products) inside the step's CUDA graph. patch() makes it a site of its own
(``site(path)``): a ``ProjSite`` whose "projection" is the norm, traced as ``x -> norm(x)``, which is
the same program as the layers' norm part (``sites.site_parts``), so the kernel cache already holds it.

Found from the data flow of one decode-shaped forward, never by name: the one module outside the layer
list that is called with exactly the tensor the last layer returned, returns one tensor of that shape,
holds a 1-D weight of its width and no projection. Its output leaves the model (``last_hidden_state``),
so the installed forward (``install``, ``ProjSite.escapes``) hands out a copy outside CUDA-graph capture:
a site kernel writes into a buffer it reuses on every call. docs/architecture.md, "The final norm".
"""
from __future__ import annotations

import torch
from torch import nn

from .sites import ProjSite

NAME = "final_norm"


def site(path: str) -> ProjSite:
    """The final norm at ``path`` (relative to the model) as a site; patch() installs it on the model."""
    return ProjSite(NAME, path, escapes=True)


def _norm_like(module: nn.Module) -> bool:
    w = getattr(module, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 1
            and not any(isinstance(m, nn.Linear) for m in module.modules()))


def find_final_norm(model: nn.Module, layers_path: str, layers: nn.ModuleList) -> str | None:
    """The path of the norm applied to the output of ``layers[-1]``, or None (no such module, or a
    forward that cannot run on one token). Runs one forward of ``model`` on one token, no gradients."""
    inside = layers_path + "."
    seen: dict[str, object] = {}

    def last_out(module, args, out):
        seen["h"] = out[0] if isinstance(out, (tuple, list)) else out

    def norm_out(path):
        def hook(module, args, out):
            h = seen.get("h")
            if ("path" not in seen and h is not None and len(args) == 1 and args[0] is h
                    and isinstance(out, torch.Tensor) and out.shape == h.shape
                    and module.weight.shape[0] == h.shape[-1]):
                seen["path"] = path
        return hook

    handles = [layers[-1].register_forward_hook(last_out)]
    for path, m in model.named_modules():
        if path and path != layers_path and not path.startswith(inside) and _norm_like(m):
            handles.append(m.register_forward_hook(norm_out(path)))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(input_ids=torch.ones(1, 1, dtype=torch.long, device=device), use_cache=True)
    except Exception:  # a forward that cannot run here leaves the final norm as it is
        return None
    finally:
        for h in handles:
            h.remove()
    return seen.get("path")
