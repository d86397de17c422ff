"""RoPE's cos and sin in a decode step as one gather from a table, not ~9 elementwise launches.

A decoder's rotary module (HF's ``*RotaryEmbedding``) recomputes cos and sin from the position ids
on every forward: a cast, a product with ``inv_freq``, a concat, cos, sin, two scalings and two
casts, each a launch of a few µs inside a step of ~200 (issue 29: a 0.5–1B model's step is launch
bound; docs/architecture.md, "From a decode step to the GPU"). Every value is a function of its
position alone (elementwise float32 ops), so for the positions a decode loop can reach (below its
cache's capacity) the module's own forward, run once on all of them, gives a table whose row ``p``
is bit for bit what the module returns at ``p``.

``RotaryTables(model, capacity).active()`` is a context manager the decode loop runs its step in:
inside it, each rotary module answers a call with one token per row from its table (built by the
module's own forward on the first such call, outside any graph capture, and checked then against
direct calls at a few positions: a mismatch keeps the module's own forward for that key). Outside
the context, and for any call it does not recognise (several tokens a row, another dtype or device,
a call first seen while a graph is being captured), the module runs its own forward. Modules whose
frequencies change with the sequence (``dynamic`` and ``longrope`` RoPE) are never tabled.
"""
from __future__ import annotations

import contextlib

import torch

_CHECKED_POSITIONS = 4


def _rope_types(module) -> list[str]:
    kind = getattr(module, "rope_type", None)
    return [str(v) for v in kind.values()] if isinstance(kind, dict) else [str(kind)]


def rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's rotary-embedding modules that can be tabled: an ``inv_freq`` buffer (or a
    per-layer-type one), a ``rope_type``, and no sequence-dependent frequencies."""
    out = []
    for m in model.modules():
        if getattr(m, "rope_type", None) is None or not any("inv_freq" in n for n, _ in m.named_buffers()):
            continue
        if any("dynamic" in t or t == "longrope" for t in _rope_types(m)):  # HF's dynamic_rope_update updates these
            continue
        out.append(m)
    return out


class RotaryTables:
    """Per rotary module of ``model`` and call key (dtype, device, extra arguments such as Gemma-3's
    layer type), the module's (cos, sin) at positions ``0 .. capacity - 1``, as one [capacity, 2, d]
    tensor; ``None`` for a key whose table did not match the module's direct calls."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        self.modules = rotary_modules(model)
        self.capacity = capacity
        self.tables: dict[tuple, torch.Tensor | None] = {}
        # the next step's rows, written by the decode loop's greedy kernels (fold_into): (key, positions, rows)
        self.folded: tuple[tuple, torch.Tensor, torch.Tensor] | None = None

    def fold_into(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where one table answers every call (one rotary module, one key), a buffer of its rows at
        ``positions`` (the decode loop's [b, 1] position buffer), filled now, that calls at exactly that buffer
        are answered with instead of the gather; whoever advances ``positions`` writes the rows of the new
        positions into it (the greedy kernels, ``greedy_kernels._choose_and_book``). Returns (table, rows), or
        None where more than one table is in use or the one in use did not match its module."""
        if len(self.tables) != 1:
            return None
        (key, table), = self.tables.items()
        if table is None:
            return None
        rows = table[positions.clamp(max=self.capacity - 1)]  # [b, 1, 2, d]
        self.folded = (key, positions, rows)
        return table, rows

    @contextlib.contextmanager
    def active(self):
        saved = [(m, m.__dict__.get("forward")) for m in self.modules]
        for m, _ in saved:
            m.forward = self._forward(m, m.forward)
        try:
            yield
        finally:
            for m, own in saved:
                if own is None:
                    m.__dict__.pop("forward", None)
                else:
                    m.forward = own

    def _forward(self, module, original):
        def forward(*args, **kwargs):
            # HF's call: (x, position_ids, [layer_type]), position_ids by position or by name
            kw = dict(kwargs)
            x, rest = (args[0], args[1:]) if args else (kw.pop("x", None), ())
            position_ids, rest = (rest[0], rest[1:]) if rest else (kw.pop("position_ids", None), rest)
            if not (isinstance(x, torch.Tensor) and isinstance(position_ids, torch.Tensor)
                    and position_ids.dim() == 2 and position_ids.shape[1] == 1):
                return original(*args, **kwargs)
            key = (id(module), x.dtype, x.device, rest, tuple(sorted(kw.items())))
            try:
                hash(key)
            except TypeError:  # an argument the table cannot be keyed by: the module answers
                return original(*args, **kwargs)
            if key not in self.tables:
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    return original(*args, **kwargs)  # tables are built eagerly, never recorded
                self.tables[key] = self._build(lambda pos: original(x, pos, *rest, **kw), position_ids)
            table = self.tables[key]
            if table is None:
                return original(*args, **kwargs)
            if self.folded is not None and self.folded[0] == key and self.folded[1] is position_ids:
                both = self.folded[2]  # written when the positions moved on (fold_into): no launch
            else:
                both = table[position_ids]  # [b, 1, 2, d]: one gather
            return both[..., 0, :], both[..., 1, :]
        return forward

    def _build(self, at, position_ids) -> torch.Tensor | None:
        """``at(positions)``, the module's own forward, at every position below the capacity, stacked;
        None unless its rows equal direct calls at a few positions (first, last and between) bit for bit."""
        dev, dtype = position_ids.device, position_ids.dtype
        cos, sin = at(torch.arange(self.capacity, device=dev, dtype=dtype)[None])
        table = torch.stack((cos[0], sin[0]), dim=1)  # [capacity, 2, d]
        probe = torch.linspace(0, self.capacity - 1, _CHECKED_POSITIONS).round().long()
        for p in probe.tolist():
            c, s = at(torch.tensor([[p]], device=dev, dtype=dtype))
            if not (torch.equal(c[0, 0], table[p, 0]) and torch.equal(s[0, 0], table[p, 1])):
                return None
        return table
