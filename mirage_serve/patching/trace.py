"""Record the data flow of one forward: every module call and every tensor-valued torch call.

    events = record(model, layers)   # one decode-shaped forward (1 token, a fresh cache)

A ``TorchFunctionMode`` sees each torch function the Python code calls (``F.linear``,
``torch.cat``, ``x * y``…) with the module stack it runs in; forward pre/post hooks on the decoder
layers' modules add the module calls with their tensor inputs and outputs. Tensors are told apart
by identity, which is what patching.install's hand-off keys on as well (a consumer gets the fused
result only when called with exactly the norm's output tensor), so the recorded flow is the one
the installed site will see. The tensors stay referenced by the events, so no ``id`` is reused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode


@dataclass
class Event:
    """One call: ``module`` (path relative to the layer list, e.g. ``"0.self_attn.q_proj"``) for a
    module call, else ``func`` for a torch function; ``stack``: the module paths it ran inside,
    outermost first (a module call's own path is not in its stack)."""

    module: str | None
    func: object
    stack: tuple[str, ...]
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)

    def takes(self, t: torch.Tensor) -> bool:
        return any(x is t for x in self.inputs)


def in_layer(e: Event, i: int) -> bool:
    """Whether event ``e`` happened in decoder layer ``i`` (its own call or anything inside it)."""
    head = e.stack[0] if e.stack else e.module
    return head is not None and head.split(".", 1)[0] == str(i)


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.events: list[Event] = []
        self.stack: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = _tensors(out)
        if self.stack and outs:  # only tensor-valued calls move data (shape, dim, dtype do not)
            self.events.append(Event(None, func, tuple(self.stack), _tensors((args, kwargs)), outs))
        return out


def record(model: torch.nn.Module, layers: torch.nn.ModuleList) -> list[Event]:
    """The events of the decoder layers during one forward of ``model`` on one token with a fresh
    cache (the decode shape: one row). Raises what the forward raises."""
    rec = _Recorder()
    handles = []
    open_calls: list[Event] = []

    def pre(path):
        def hook(module, args, kwargs):
            ev = Event(path, None, tuple(rec.stack), _tensors((args, kwargs)))
            rec.events.append(ev)
            open_calls.append(ev)
            rec.stack.append(path)
        return hook

    def post(path):
        def hook(module, args, kwargs, out):
            rec.stack.pop()
            open_calls.pop().outputs = _tensors(out)
        return hook

    for i, layer in enumerate(layers):
        for name, m in layer.named_modules():
            path = f"{i}.{name}" if name else str(i)
            handles.append(m.register_forward_pre_hook(pre(path), with_kwargs=True))
            handles.append(m.register_forward_hook(post(path), with_kwargs=True))
    device = next(model.parameters()).device
    ids = torch.ones(1, 1, dtype=torch.long, device=device)  # [B=1, S=1]: the decode shape
    try:
        with torch.no_grad(), rec:
            model(input_ids=ids, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    return rec.events
