"""The decoder layer's residual adds moved into the projections that feed them, found from the traced layer.

    plans = plan_residual_adds(model, layers, candidates)   # one LayerPlan per decoder layer
    layer.forward = plans[i].forward(layer, slots)           # installed by patching.pipeline (records kept)

A decoder layer adds each block's output to its residual stream: ``h = x + o_proj(attn(norm(x)))``,
then ``h + down_proj(mlp(norm(h)))``. Each add is a torch kernel of its own (two a layer, ~1.7 µs
each at batch 8), and it breaks the chain of programmatic dependent launches between our kernels.
A projection site prepared as ``(x, r) -> r + x Wᵀ`` (``sites.ProjSite(residual=True)``: searched,
verified and cached like any other) does the add in its epilogue, if the layer hands it ``r``
before it runs and then takes its output as the sum.

Which adds can move is read from the data flow, not from the layer's source text or module names
(docs/architecture.md, "Residual adds"):

* Every ``a + b`` in the layer class's ``forward`` is rewritten to ``_mirage_add(k, a, b)`` (``k``:
  the add's place in the source, ``_mirage_add`` a closure cell of the layer's copy), every
  ``a * b`` and ``a / b`` to ``_mirage_scale(j, op, a, b)``; the rest of
  the source, its decorators, globals and line numbers stay, so the rewritten forward is the
  original one whenever nothing is fused (and torch.compile traces it as it would the original).
  A forward without source, or with a closure (``super()``), is not rewritten and its adds stay.
* One decode-shaped forward is recorded (``trace.record``) with the rewritten forwards logging
  each add's operands and result. Add ``k`` of a layer moves into projection ``P`` when, on that
  forward: ``k`` ran once; one operand is exactly ``P``'s output tensor (one call of ``P``, a
  projection site of the layer with no tail); the other, ``r``, is the layer's input or the result
  of an earlier add of the layer, available before ``P`` ran; both have one shape and dtype (no
  broadcast); nothing but the add (and ops returning the very same tensor, such as eval dropout)
  reads ``P``'s output; and nothing changes ``r`` in place. These are what make ``r + P(x)``
  computed inside ``P`` the same tensor the add would produce, read by no one in between.
  The addend may also be ``N(P(x))`` for one module ``N`` without projections called on exactly
  ``P``'s output (Gemma-2/3's and OLMo-2's post-norms): ``P``'s site then computes
  ``r + N(P(x))`` and ``N``, called on that output, passes it on (``post_forward``). Or it may be
  ``P(x) * c`` (or ``/ c``) for a number ``c``, written in the layer's forward (Granite's and
  MiniCPM's residual multipliers): the site computes ``r + P(x) * c`` and that product passes the
  kernel's output on.
* At run time the layer's wrapper offers its input to the projections fed by it; an add offers its
  result to those fed by it. A projection takes the residual only when it runs its kernel on that
  call; the add returns the projection's output when it holds exactly the residual it was offered
  and adds as the original does otherwise (prefill-sized inputs, a fallback, a hook). A projection
  output that took a residual but does not come back to its add raises rather than let a residual
  be lost or added twice (``unpatch()`` and report the model type).

Works for any layer whose adds have that shape: Llama, Mistral, Qwen, Phi-3 (through its dropout),
Gemma-2/3, OLMo-2 and GLM-4 (with their post-norms), Granite (with its multiplier), Cohere's
parallel layer (the attention's add; its MLP add comes after down_proj has run). Phi-2's and
GPT-NeoX's ``attn + mlp + residual`` stay in the layer, with the reason in the report. Under tensor
parallelism a post-norm site is refused (the norm needs the all-reduced sum), so its add stays.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .sites import ProjSite
from .forward_rewrite import Rewritten, bind, rewrite, scaled
from .handoff import ResidualSlot, hooked
from .trace import Event, in_layer, record

__all__ = ["FusedAdd", "LayerPlan", "plan_residual_adds"]


@dataclass(frozen=True)
class FusedAdd:
    """Add ``index`` of the layer's forward moves into projection ``proj`` (a path in the layer); its
    residual is the layer's input (``source`` None) or the result of add ``source``. What the layer
    does to the projection's output before adding it moves into the kernel too: ``post``, a norm
    module's path (Gemma's post-norms), or ``scale``, (j, "mul" / "div", factor) of its ``j``-th
    product or quotient by a constant (Granite's residual multiplier)."""

    index: int
    proj: str
    source: int | None
    post: str | None = None
    scale: tuple[int, str, float] | None = None


@dataclass
class LayerPlan:
    """Which adds of one layer move into which projections, and why the others stay."""

    fused: tuple[FusedAdd, ...] = ()
    why_not: dict[str, str] = field(default_factory=dict)  # what stays -> why (for the report)
    rewritten: Rewritten | None = None

    def fused_into(self, proj: str) -> FusedAdd | None:
        """The add this layer moves into projection ``proj`` (a path in the layer), if any."""
        return next((f for f in self.fused if f.proj == proj), None)

    def site_for(self, site: ProjSite) -> ProjSite:
        """``site`` prepared with its residual add (and what comes before it), if this layer fuses it."""
        f = self.fused_into(site.proj) if site.tail is None else None
        if f is None:
            return site
        return replace(site, residual=True, post=f.post, post_scale=f.scale[1:] if f.scale else None)

    def forward(self, layer: nn.Module, slots: dict[str, ResidualSlot]):
        """``layer.forward`` handing each residual to its projection through ``slots`` (by path);
        a projection missing from ``slots`` (not prepared) leaves its add to the layer."""
        fused = {f.index: (f, slots[f.proj]) for f in self.fused if f.proj in slots}
        from_input = [s for f, s in fused.values() if f.source is None]
        from_add: dict[int, list[ResidualSlot]] = {}
        for f, s in fused.values():
            if f.source is not None:
                from_add.setdefault(f.source, []).append(s)
        scaling = {f.scale[0]: s for f, s in fused.values() if f.scale}  # scale op j -> its projection's slot
        paths = {f.proj for f, _ in fused.values()} | {f.post for f, _ in fused.values() if f.post}
        watched = [layer] + [m for path in paths for m in _chain(layer, path)]
        offering = [False]

        def scale(j, op, a, b):  # the kernel scaled its output already: pass it on
            slot = scaling.get(j)
            if slot is not None and slot.out is not None and (a is slot.out or (op == "mul" and b is slot.out)):
                return slot.out
            return scaled(j, op, a, b)

        def add(k, a, b):
            entry = fused.get(k)
            out = None
            if entry is not None:
                slot = entry[1]
                y, r = slot.out, slot.taken
                slot.clear()
                if y is not None:
                    if not ((a is y and b is r) or (b is y and a is r)):
                        raise RuntimeError(_LOST.format(proj=entry[0].proj))
                    out = y
            if out is None:
                out = a + b
            if offering[0]:
                for s in from_add.get(k, ()):
                    s.offer(out)
            return out

        bound = bind(self.rewritten, layer, add, scale)
        first = self.rewritten.first_arg
        every = [s for _, s in fused.values()]

        def forward(*args, **kwargs):
            # A hook may read a projection's output or keep the layer's: then nothing is offered
            # and the layer adds as the original does.
            offering[0] = not hooked(watched)
            if offering[0]:
                hidden = args[0] if args else kwargs.get(first)
                for s in from_input:
                    s.offer(hidden)
            try:
                out = bound(*args, **kwargs)
            finally:
                lost = [s for s in every if s.out is not None]
                for s in every:  # nothing offered outlives the call
                    s.clear()
            if lost:
                raise RuntimeError(_LOST.format(proj=", ".join(_path(layer, s.proj) for s in lost)))
            return out
        return forward


_LOST = ("mirage_serve: the residual added in {proj}'s kernel did not come back to the layer's add "
         "unchanged; unpatch() the model and report this model type")


def _chain(layer: nn.Module, path: str) -> list[nn.Module]:
    """The modules from ``layer`` down to ``path`` (exclusive of the layer): hooks there see the output."""
    parts, out = path.split("."), []
    for i in range(len(parts)):
        out.append(layer.get_submodule(".".join(parts[:i + 1])))
    return out


def _path(layer: nn.Module, module) -> str:
    return next((n for n, m in layer.named_modules() if m is module), type(module).__name__)


def plan_residual_adds(model: nn.Module, layers: nn.ModuleList,
                       candidates: list[str]) -> list[LayerPlan] | str:
    """Per decoder layer, the adds that move into one of ``candidates`` (projection paths within a
    layer: the family's projection sites with no tail), from one recorded decode-shaped forward; or
    why no layer can be planned (one line). The model is left as it was."""
    rewritten: dict[type, Rewritten | str] = {type(layer): rewrite(type(layer)) for layer in layers}
    usable = {cls: rw for cls, rw in rewritten.items() if isinstance(rw, Rewritten)}
    if not usable:
        return "; ".join(sorted({rw for rw in rewritten.values() if isinstance(rw, str)}))
    logs: dict[int, _Log] = {}
    saved = []
    for i, layer in enumerate(layers):
        rw = usable.get(type(layer))
        if rw is None:
            continue
        log = logs[i] = _Log(rw.first_arg)
        saved.append((layer, layer.__dict__.get("forward", _MISSING)))
        layer.forward = log.wrap(bind(rw, layer, log.add, log.scale))
    try:
        events = record(model, layers)
    except Exception as e:  # any forward can fail under tracing hooks; the adds stay where they are
        return f"the decode-shaped forward could not be traced ({type(e).__name__}: {e})".splitlines()[0]
    finally:
        for layer, previous in saved:
            if previous is _MISSING:
                del layer.forward
            else:
                layer.forward = previous
    plans = []
    for i, layer in enumerate(layers):
        rw = rewritten[type(layer)]
        if isinstance(rw, str):
            plans.append(LayerPlan(why_not={"residual adds": rw}))
            continue
        mine = [e for e in events if in_layer(e, i)]
        plans.append(_plan_layer(layer, str(i), mine, logs[i], candidates, rw))
    return plans


_MISSING = object()


class _Log:
    """What the rewritten forward of one layer did on the recorded call: its input, each add, each
    product or quotient."""

    def __init__(self, first_arg: str):
        self.first_arg = first_arg
        self.hidden = None
        self.adds: list[tuple[int, object, object, object]] = []  # (k, a, b, a + b)
        self.scales: list[tuple[int, str, object, object, object]] = []  # (j, op, a, b, a op b)

    def add(self, k, a, b):
        out = a + b
        self.adds.append((k, a, b, out))
        return out

    def scale(self, j, op, a, b):
        out = scaled(j, op, a, b)
        self.scales.append((j, op, a, b, out))
        return out

    def wrap(self, bound):
        def forward(*args, **kwargs):
            self.hidden = args[0] if args else kwargs.get(self.first_arg)
            return bound(*args, **kwargs)
        return forward


def _inplace(e: Event) -> bool:
    name = getattr(e.func, "__name__", "")
    return e.module is None and ((name.endswith("_") and not name.endswith("__")) or name.startswith("__i"))


def _plan_layer(layer: nn.Module, prefix: str, events: list[Event], log: _Log, candidates: list[str],
                rw: Rewritten) -> LayerPlan:
    calls: dict[str, list[int]] = {}  # module path in the layer -> indices of its call events
    for n, e in enumerate(events):
        if e.module is not None and e.module.startswith(prefix + "."):
            calls.setdefault(e.module[len(prefix) + 1:], []).append(n)
    produced = {}  # id(tensor) -> index of the first torch call that returned it
    for n, e in enumerate(events):
        for o in e.outputs if e.module is None else ():
            produced.setdefault(id(o), n)
    counts: dict[int, int] = {}
    for k, *_ in log.adds:
        counts[k] = counts.get(k, 0) + 1
    results = {id(out): k for k, _, _, out in log.adds}
    flow = _Flow(layer, events, calls, produced, log, results)
    fused, why, used = [], {}, set()
    for k, a, b, out in log.adds:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        found = [(p, via, z, r) for p in candidates if p not in used and len(calls.get(p, ())) == 1
                 for z, r in ((a, b), (b, a)) for via in flow.reaching(p, z)]
        if not found:
            continue  # not an add of a projection's output (or of its post-norm's, its scaled copy)
        proj, (post, scale), z, r = found[0]
        reason = "the add runs more than once a step" if counts[k] != 1 else flow.why_not(proj, post, z, r, out)
        if reason:
            why[f"residual add into {proj}"] = reason
            continue
        used.add(proj)
        fused.append(FusedAdd(k, proj, None if r is log.hidden else results[id(r)], post, scale))
    for p in candidates:
        if p not in used and f"residual add into {p}" not in why and p in calls and flow.feeds_an_add(p):
            why.setdefault(f"residual add after {p}", "the layer adds something computed from the projection's "
                                                      "output other than it, its norm or a constant multiple")
    return LayerPlan(tuple(fused), why, rw)


@dataclass
class _Flow:
    """The recorded data flow of one layer, for deciding whether one add can move."""

    layer: nn.Module
    events: list[Event]
    calls: dict[str, list[int]]
    produced: dict[int, int]
    log: _Log
    results: dict[int, int]

    def output(self, path: str):
        outs = self.events[self.calls[path][0]].outputs
        return outs[0] if len(outs) == 1 else None

    def reaching(self, proj: str, z) -> list[tuple[str | None, tuple | None]]:
        """How projection ``proj``'s output reaches the addend ``z``, as [(post, scale)]: as it is
        ([(None, None)]); through one post-norm ([(its path, None)]: a module with no projection
        inside, called once, on exactly that output alone, returning ``z`` of its shape and dtype);
        through one product or quotient by a number ([(None, (j, op, factor))]); or not at all ([])."""
        y = self.output(proj)
        if y is None:
            return []
        if z is y:
            return [(None, None)]
        if z.shape != y.shape or z.dtype != y.dtype:
            return []
        for path, at in self.calls.items():
            e = self.events[at[0]]
            if (len(at) == 1 and len(e.inputs) == 1 and e.inputs[0] is y and len(e.outputs) == 1
                    and e.outputs[0] is z
                    and not any(isinstance(m, nn.Linear) for m in self.layer.get_submodule(path).modules())):
                return [(path, None)]
        for j, op, a, b, out in self.log.scales:
            number = b if a is y else a if (op == "mul" and b is y) else None
            if out is z and isinstance(number, (int, float)) and not isinstance(number, bool) \
                    and sum(s[0] == j for s in self.log.scales) == 1:
                return [(None, (j, op, float(number)))]
        return []

    def feeds_an_add(self, proj: str) -> bool:
        """Whether ``proj``'s output reaches one of the layer's adds through torch calls outside any
        other projection (the q projection's reaches the adds only through o_proj: it does not)."""
        prefix = self.events[self.calls[proj][0]].module[:-len(proj)]
        linears = {prefix + n for n, m in self.layer.named_modules() if isinstance(m, nn.Linear)}
        reached = {id(t) for t in self.events[self.calls[proj][0]].outputs}
        for e in self.events[self.calls[proj][0] + 1:]:
            if e.module is None and not linears & set(e.stack) and any(id(t) in reached for t in e.inputs):
                reached.update(id(o) for o in e.outputs)
        return any(id(a) in reached or id(b) in reached for _, a, b, _ in self.log.adds)

    def why_not(self, proj: str, post: str | None, z, r, out) -> str:
        """Why ``r + z`` (z: ``proj``'s output, or its ``post``-norm's) cannot be computed inside
        ``proj``'s kernel, or ""."""
        y, log = self.output(proj), self.log
        if z.shape != r.shape or z.dtype != r.dtype:
            return "the add broadcasts or promotes (the operands' shapes or dtypes differ)"
        if r is not log.hidden and id(r) not in self.results:
            return "the residual is neither the layer's input nor an earlier add's result"
        if r is not log.hidden and self.produced.get(id(r), len(self.events)) > self.calls[proj][0]:
            return "the residual is computed after the projection runs"
        add_at, scaled_at = self.produced.get(id(out)), self.produced.get(id(z)) if z is not y else None
        inside = None if post is None else f"{self.events[self.calls[post][0]].module}"
        for n, e in enumerate(self.events):
            if n in (add_at, scaled_at) or e.module is not None or (inside is not None and inside in e.stack):
                continue  # the add, the scaling, module calls (their torch calls are looked at), the post-norm
            for t in (y, z):
                if e.takes(t) and (_inplace(e) or not any(o is t for o in e.outputs)):
                    return "the projection's output is read by something besides the add"
            if e.takes(r) and _inplace(e):
                return "the residual is changed in place"
        return ""
