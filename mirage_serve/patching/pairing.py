"""Two parts of a site that are one program (k_proj and v_proj) run as one launch, where measured faster.

``site_parts`` gives a layer's k_proj and v_proj one program (same structure, other weights), run on
the same normed input. ``merge_twins`` makes each such pair one part of the site: per bucket, either
one paired launch (``superopt.runtime.paired``: each kernel once, the second instance on a grid axis
the μGraph leaves free) or the two launches as before. Which one is decided per program and bucket
by ``Pairing.call``: on a GPU by timing both in CUDA graphs, as a decode step runs them, on weights
copied beyond L2; under Triton's interpreter (CPU tests) the paired launch is taken untimed, so the
path is exercised; other backends keep the two launches. The decision and the paired kernels are
stored in the kernel cache (``Pairing``), so a warm patch() neither times nor compiles them. The
site's self-check then runs whatever was chosen against the float64 modules, as for any part.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from typing import Callable

import torch

from ..site_kernel import bound_call

PAIR_MARGIN = 0.98  # paired only when at least 2% faster: timing noise must not flip the choice
_MAX_COPIES = 16


def twins(parts: list[tuple[str, dict, tuple[int, ...]]]) -> list[tuple[str, dict, dict]]:
    """(name, first part's kernels, second part's kernels) for each name two parts share."""
    seen: dict[str, dict] = {}
    out = []
    for name, kernels, _ in parts:
        if name in seen and all(o[0] != name for o in out):
            out.append((name, seen[name], kernels))
        seen.setdefault(name, kernels)
    return out


def merge_twins(parts: list[tuple[str, dict, tuple[int, ...]]], pair_call: Callable
                ) -> list[tuple[dict, tuple[int, ...]]]:
    """``parts``: (program name, {bucket: BucketKernel}, site outputs) in site order. Returns
    ({bucket: BucketKernel}, outputs) per part. ``pair_call(a, b, m)``: a call running both
    BucketKernels at ``m`` rows as one launch, or None. Where it gives one at any bucket, a name's
    first two parts (``twins``) become one part at the first's place, returning the first's outputs
    then the second's (one by one at the buckets without a paired call); otherwise they stay apart."""
    out: list = [(kernels, outputs) for _, kernels, outputs in parts]
    for _, a, b in twins(parts):
        calls = {m: pair_call(a[m], b[m], m) for m in a}
        if all(c is None for c in calls.values()):
            continue
        i, j = (next(n for n, p in enumerate(parts) if p[1] is k) for k in (a, b))
        out[i] = ({m: replace(a[m], bound=calls[m] or _one_by_one(a[m], b[m])) for m in a},
                  parts[i][2] + parts[j][2])
        out[j] = None
    return [o for o in out if o is not None]


def _one_by_one(a, b) -> Callable:
    call_a, call_b = bound_call(a), bound_call(b)
    return lambda x2: call_a(x2) + call_b(x2)


class Pairing:
    """``call(a, b, m)`` for ``merge_twins``: builds, times and remembers one ``PairedGraph`` per pair
    of executors (shared by every layer); ``note(a, b)`` says what was measured and chosen. With a
    kernel cache the decision, its times and the paired kernels' binaries are stored (``_key``),
    so a later patch() on that GPU and toolchain times nothing and compiles nothing."""

    def __init__(self, device: torch.device, cache=None, dtype: str = ""):
        self.device, self.cache, self.dtype = device, cache, dtype
        self._memo: dict[tuple[int, int], tuple[object, str]] = {}  # executors -> (PairedGraph or None, note)
        self.compiles = 0  # paired kernels Triton compiled (for the report's count)

    def call(self, a, b, m: int) -> Callable | None:
        from superopt.runtime.compiled import CompiledGraph

        ga, gb = a.executor.run, b.executor.run
        if not (isinstance(ga, CompiledGraph) and isinstance(gb, CompiledGraph)):
            return None  # the torch backend: two calls
        key = (id(ga), id(gb))
        if key not in self._memo:
            self._memo[key] = self._decide(a, b, m)
        paired = self._memo[key][0]
        return paired.bind(a.feeds, b.feeds) if paired is not None else None

    def note(self, a, b) -> str | None:
        got = self._memo.get((id(a.executor.run), id(b.executor.run)))
        return got[1] if got else None

    def _decide(self, a, b, m: int) -> tuple[object, str]:
        from superopt.runtime.interpreter import interpreting
        from superopt.runtime.paired import PairedGraph

        key = self._key(a.executor.run, m)
        stored = self.cache.get(key, count=False) if key is not None else None  # not a program's hit
        known = stored.meta.get("paired") if stored is not None else None
        if known is False:
            return None, f"two launches (cached: {_times(stored.meta)})"
        try:
            paired = PairedGraph(a.executor.run, b.executor.run, stored.binaries if known else None)
            self.compiles += paired.compiles
            if interpreting():
                return paired, "one paired launch (interpreter: not timed)"
            if self.device.type != "cuda":
                return None, "two launches (no GPU to time the paired launch on)"
            with torch.cuda.device(self.device):  # the model's GPU, whichever is current
                if not _agrees(paired, a, b):
                    return None, "two launches (the paired launch disagreed with them)"
                if known:
                    if not stored.binaries:  # a decision shipped without binaries: keep the ones built now
                        self._store(key, a.executor.run, paired, stored.meta)
                    return paired, f"one paired launch (cached: {_times(stored.meta)})"
                one, two = _time(paired, a, b, self.device)
        except Exception as e:  # a paired build that fails costs the pairing, never the site
            return None, f"two launches (paired launch failed: {type(e).__name__}: {e})"
        chosen = one < PAIR_MARGIN * two
        meta = {"paired": chosen, "paired_us": round(one, 2), "two_us": round(two, 2),
                "device": torch.cuda.get_device_name(self.device)}
        self._store(key, a.executor.run, paired if chosen else None, meta)
        return (paired if chosen else None), f"{'one paired launch' if chosen else 'two launches'}: {_times(meta)}"

    def _key(self, run, m: int):
        """The cache key of pairing two instances of ``run`` (its μGraph and launch configuration,
        so a re-searched program is another key) at ``m`` rows on this GPU; None without a cache."""
        if self.cache is None or self.device.type != "cuda":
            return None
        from superopt.codegen.launch import stored_launches
        from superopt.ir import digest

        from .. import backends
        from ..cache import CacheKey, versions_now

        ident = f"paired:{digest(run.graph, 32)}:{json.dumps(stored_launches(run.launch), sort_keys=True)}"
        return CacheKey(ident, f"b{m}", self.dtype or "any", backends.arch_of(self.device).replace("_", ""),
                        "triton", versions_now(), f"{run.graph.name}-paired")

    def _store(self, key, run, paired, meta: dict) -> None:
        if key is None:
            return
        from superopt.ir.text import to_text

        from ..cache import CacheEntry, CacheWarning

        entry = CacheEntry(to_text(run.graph), {}, paired.binaries() if paired is not None else {}, meta)
        try:
            self.cache.put(key, entry)
        except (OSError, ValueError, TimeoutError) as e:  # a decision not saved must not fail patch()
            warnings.warn(f"mirage_serve cache: paired launch of {key.dirname()} not saved ({e})", CacheWarning,
                          stacklevel=2)


def _times(meta: dict) -> str:
    return f"paired {meta['paired_us']:.1f} µs, two launches {meta['two_us']:.1f} µs"


def _activations(k) -> torch.Tensor:
    """Random activations for BucketKernel ``k`` (its μGraph input where ``feeds`` has None)."""
    from superopt.runtime.dtypes import TORCH_DTYPES

    v = k.executor.run.graph.inputs[k.feeds.index(None)]
    dev = next(t.device for t in k.feeds if t is not None)
    return torch.randn(v.type.shape, device=dev, dtype=TORCH_DTYPES[v.type.dtype])


def _agrees(paired, a, b) -> bool:
    """The paired launch gives both instances' results (within float32 summation-order noise: split-K
    kernels add across blocks in any order) on random activations."""
    x = _activations(a)
    with torch.no_grad():
        want = [o.float().clone() for o in bound_call(a)(x) + bound_call(b)(x)]
        got = [o.float() for o in paired.bind(a.feeds, b.feeds)(x)]
    return len(got) == len(want) and all(torch.allclose(g, w, rtol=1e-2, atol=1e-3) for g, w in zip(got, want))


def _time(paired, a, b, device: torch.device) -> tuple[float, float]:
    """(µs paired, µs two launches) on copies of the pair's weights that together exceed twice L2."""
    from superopt.runtime.paired import time_paired

    weights = sum(t.numel() * t.element_size() for k in (a, b) for t in k.feeds if t is not None)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    copies = max(2, min(_MAX_COPIES, math.ceil(2 * l2 / max(weights, 1))))

    def clone(feeds):
        return [None if t is None else t.detach().clone() for t in feeds]
    pairs = [(clone(a.feeds), clone(b.feeds)) for _ in range(copies)]
    x = _activations(a)
    together = [paired.bind(fa, fb) for fa, fb in pairs]
    apart = [(bound_call(replace(a, feeds=tuple(fa))), bound_call(replace(b, feeds=tuple(fb)))) for fa, fb in pairs]
    with torch.no_grad():
        return time_paired(together, apart, [x])
