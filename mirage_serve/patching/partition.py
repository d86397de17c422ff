"""Sites of a decoder family with no adapter, from the data flow of its traced decoder layers.

    family, why = family_from_trace(model)   # (Family, "") or (None, one-line reason)

One decode-shaped forward is recorded (``trace.record``) and each decoder layer's events are
partitioned into the sites the rest of patch() consumes (``patching.sites``), by what flows
where, never by module names:

* a **norm** is a module without projections inside, called on one tensor ``x: [..., D]``, that
  returns one tensor of the same shape and holds a 1-D weight of size D;
* its **consumers** are the modules called with exactly its output tensor: an ``nn.Linear`` (q, k,
  v, a fused qkv), or a block (the MLP) whose own output is the output of its last projection, a
  direct child; that block is a consumer with the projection as its ``tail`` only after a check
  that the block with the tail replaced by the identity computes, on the recorded input, exactly
  the tensor the tail was fed (``sites._without``);
* a ``NormSite`` is kept only when every tensor-valued use of the norm's output is inside one of
  its consumers: patching.install may defer the norm (it returns a placeholder), which is safe only if
  nothing else reads it. Parallel attention + MLP layers (Phi-2, Cohere, GPT-NeoX's parallel
  residual) give one site whose consumers are q/k/v and the MLP;
* a block called on one tensor that no norm feeds (OLMo-2's post-norm MLP, on the residual stream)
  is a ``ProjSite`` up to its tail projection, checked as a norm's block consumer is;
* every other projection of the layer (o_proj / dense, down_proj / fc2, and the attention input
  projections of layers with no norm before them, OLMo-2's again) is a ``ProjSite`` alone.

Sites are kept where every decoder layer has them (same paths, same kind); the attention core,
residual adds and norms that feed no projection stay in the original modules and are listed in
``Family.not_patched``. A layer list that cannot be found, a forward that cannot be recorded, or a
layer with no site leaves the model unchanged with the reason (docs/architecture.md).
"""
from __future__ import annotations

import torch
from torch import nn

from .sites import Consumer, Family, NormSite, ProjSite, _without
from .trace import Event, in_layer, record

__all__ = ["family_from_trace", "find_layer_lists"]


def find_layer_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """Candidate decoder layer lists, longest first: each ``nn.ModuleList`` of modules of one
    class that each hold a projection (``nn.Linear``); ties keep module order."""
    found = []
    for path, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or not len(m) or len({type(c) for c in m}) != 1:
            continue
        if all(any(isinstance(s, nn.Linear) for s in c.modules()) for c in m):
            found.append((path, m))
    return sorted(found, key=lambda f: -len(f[1]))


def family_from_trace(model: nn.Module, model_type: str = "") -> tuple[Family | None, str]:
    """The ``Family`` of ``model`` partitioned from one traced forward, or (None, why not)."""
    candidates = find_layer_lists(model)
    if not candidates:
        return None, "no decoder layer list found (a ModuleList of layers holding projections)"
    for path, layers in candidates:  # the longest list the token's forward runs (not a vision tower)
        try:
            events = record(model, layers)
        except Exception as e:  # any forward can fail under tracing hooks; the model stays unchanged
            return None, f"the decode-shaped forward could not be traced ({type(e).__name__}: {e})".splitlines()[0]
        if events:
            break
    else:
        return None, "no candidate decoder layer list runs in a forward on input_ids"
    per_layer = [_layer_sites(i, layer, [e for e in events if in_layer(e, i)])
                 for i, layer in enumerate(layers)]
    if not any(sites for sites, _ in per_layer):
        why = "; ".join(f"{b}: {w}" for b, w in per_layer[0][1].items()) or \
            "no norm → projection or projection found in the traced layer"
        return None, f"the decoder layer could not be partitioned into sites ({why})"
    common = [s for s in per_layer[0][0] if all(s in sites for sites, _ in per_layer[1:])]
    left: dict[str, str] = {}
    for sites, _ in per_layer:
        for s in sites:
            if s not in common:
                left.setdefault(s.name, "not found in every decoder layer")
    not_patched = list(left.items()) + list(per_layer[0][1].items())
    if not common:
        return None, "the decoder layers share no site (layers of different structure)"
    return Family(model_types=(model_type,), layers=(path,), sites=tuple(common),
                  not_patched=tuple(not_patched)), ""


def _rel(path: str) -> str:
    return path.split(".", 1)[1] if "." in path else ""


def _is_norm(layer: nn.Module, e: Event) -> bool:
    if e.module is None or len(e.inputs) != 1 or len(e.outputs) != 1:
        return False
    rel = _rel(e.module)
    if not rel:
        return False
    m = layer.get_submodule(rel)
    if any(isinstance(s, nn.Linear) for s in m.modules()):
        return False
    x, y = e.inputs[0], e.outputs[0]
    w = getattr(m, "weight", None)
    return (x.dim() >= 1 and y.shape == x.shape and isinstance(w, torch.Tensor) and w.dim() == 1
            and w.shape[0] == x.shape[-1])


def _layer_sites(i: int, layer: nn.Module, events: list[Event]):
    """(sites of layer ``i`` in call order, {block: why not a site}) from its recorded events."""
    calls = [e for e in events if e.module is not None]
    sites: list = []
    notes: dict[str, str] = {}
    covered: set[str] = set()  # projections (relative paths) a norm site computes
    for e in calls:
        if not _is_norm(layer, e):
            continue
        norm = _rel(e.module)
        site, why = _norm_site(layer, e, calls, events)
        if site is None:
            if why:
                notes[norm] = why
            continue
        sites.append(site)
        for c in site.consumers:
            mod = layer.get_submodule(c.path)
            covered.update(f"{c.path}.{n}" if n else c.path for n, s in mod.named_modules()
                           if isinstance(s, nn.Linear) and n != (c.tail or None))
    seen: set[str] = set()
    for e in calls:
        rel = _rel(e.module)
        if not rel or rel in covered or rel in seen:
            continue
        mod = layer.get_submodule(rel)
        if type(mod) is nn.Linear:
            seen.add(rel)
            sites.append(ProjSite(_name("proj", rel), rel))
            continue
        site = _block_site(rel, mod, e, calls, covered | seen)
        if site is not None:
            sites.append(site)
            seen.add(rel)
            covered.update(f"{rel}.{n}" for n, s in mod.named_modules()
                           if isinstance(s, nn.Linear) and n != site.tail)
    return sites, notes


def _block_site(rel: str, mod: nn.Module, call: Event, calls: list[Event], taken: set[str]) -> ProjSite | None:
    """A block called on one tensor that no norm site consumes (OLMo-2's post-norm MLP on the
    residual stream) as one site up to its tail projection, ``act(gate(h)) * up(h)`` in one
    kernel rather than gate and up apart with the product left to eager torch; or None. The
    block's projections must all be free (none in another site) and one besides the tail."""
    if len(call.inputs) != 1:  # attention takes positions and a mask too: its core stays original
        return None
    inner = [n for n, s in mod.named_modules() if isinstance(s, nn.Linear)]
    if any(f"{rel}.{n}" in taken for n in inner):
        return None
    tail = _tail(mod, call, calls)
    if tail is None or len(inner) < 2:
        return None
    return ProjSite(_name("block", rel), rel, tail=tail)


def _name(kind: str, path: str) -> str:
    return f"{kind}_{path.replace('.', '_')}"


def _norm_site(layer: nn.Module, call: Event, calls: list[Event], events: list[Event]):
    """The NormSite of the norm called by ``call``, or (None, why not)."""
    norm, n = _rel(call.module), call.outputs[0]
    consumers: list[Consumer] = []
    for e in calls:
        if not e.takes(n) or e.module is None:
            continue
        rel = _rel(e.module)
        mod = layer.get_submodule(rel)
        if type(mod) is nn.Linear:
            if not any(c.path == rel or rel.startswith(c.path + ".") for c in consumers):
                consumers.append(Consumer(rel))
        elif len(e.inputs) == 1 and not any(rel.startswith(c.path + ".") for c in consumers):
            tail = _tail(mod, e, calls)
            if tail is not None:
                consumers.append(Consumer(rel, tail=tail))
    if not consumers:
        return None, "its output feeds no projection (a post-norm or a q/k norm); left original"
    # every tensor-valued use of n must happen inside a consumer (the norm may be deferred)
    inside = {f"{_layer_prefix(calls)}{c.path}" for c in consumers}
    for ev in events:
        if ev.module is None and ev.takes(n) and call.module not in ev.stack \
                and not any(s in inside for s in ev.stack):
            where = ev.stack[-1] if ev.stack else "the layer"
            return None, (f"its output also feeds {getattr(ev.func, '__name__', ev.func)} in "
                          f"{_rel(where) or 'the layer forward'}, outside the projections")
    return NormSite(_name("norm", norm), norm, tuple(consumers)), ""


def _layer_prefix(calls: list[Event]) -> str:
    head = calls[0].stack[0] if calls[0].stack else calls[0].module
    return head.split(".", 1)[0] + "."


def _tail(mod: nn.Module, call: Event, calls: list[Event]) -> str | None:
    """The direct child projection whose output ``mod`` returns, if ``mod`` without it computes
    exactly what that projection was fed on the recorded call; else None."""
    if len(call.outputs) != 1:
        return None
    out = call.outputs[0]
    for e in calls:
        if e.module is None or not e.module.startswith(call.module + ".") or not any(o is out for o in e.outputs):
            continue
        child = e.module[len(call.module) + 1:]
        if "." in child or type(mod.get_submodule(child)) is not nn.Linear or len(e.inputs) != 1:
            return None
        with torch.no_grad():
            fed = _without(mod, child)(call.inputs[0])
        return child if isinstance(fed, torch.Tensor) and torch.equal(fed, e.inputs[0]) else None
    return None
