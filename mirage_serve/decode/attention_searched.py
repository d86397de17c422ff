"""Decode attention as a searched site: the step's attention program, through the search, run on the KV cache.

One decode step of an attention module, after its q / k / v projections, is
``superopt.lax.attention.decode_layer_attention_program`` at the module's heads, head dim and scale,
the step's rows and the cache's capacity: [the per-head q / k RMSNorm,] RoPE on q and k, the cache
write of k and v at the position, q·kᵀ·scale [softcapped] + mask, the float32 max-subtracted softmax,
· v. ``optimize.choose`` gives its μGraph as it does for every other site: the kernel cache, else the
search (a structure searched at another capacity or batch is re-instantiated first: from this process's
result, or from the designs an earlier process kept with its cache entry), else the program itself as
library ops. It is built with both cache writes in place (``compile_graph(in_place=...)``):
a step writes one slot of the cache, never a copy of it.

The hand-written kernels of ``attention_launch`` stay as a reference that the GPU profile may pick:
``AttentionSearch.decide`` times both on the step's own tensors (a CUDA graph replayed over copies of
the layer's cache larger than L2, at the middle of the cache: the searched program reads the whole
static cache, masked, where the hand-written kernels stop at the position) and keeps the faster, once
per shape. Where no GPU can time them (the Triton interpreter), the searched μGraph runs.
docs/architecture.md, "Decode attention", says where this sits.
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, replace

import torch

from superopt.ir import digest

from .cache_pool import LENGTH_QUANTUM

log = logging.getLogger("mirage_serve")

# Qwen3's q / k norm + RoPE + attention kernel is 31 block ops; the search's default cap (24) finds no
# fused design for it (benchmarks/search_results.md, "Decode attention as HF computes it").
ATTENTION_BLOCK_OPS = 40


@dataclass(frozen=True)
class Shape:
    """What one searched attention program depends on."""

    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    capacity: int            # the static cache's length (the program reads all of it, masked)
    dtype: str               # "bfloat16", "float16", "float32"
    scale: float
    softcap: float | None    # Gemma-2's logit softcap
    qk_norm_eps: float | None  # the per-head q / k RMSNorm's eps, when the program applies it

    def program(self):
        from superopt.lax.attention import decode_layer_attention_program
        return decode_layer_attention_program(
            self.batch, self.q_heads, self.kv_heads, self.head_dim, self.capacity, self.dtype,
            softcap=self.softcap, qk_norm=self.qk_norm_eps is not None, eps=self.qk_norm_eps or 1e-6,
            scale=self.scale, name=f"decode_attention_q{self.q_heads}_kv{self.kv_heads}_d{self.head_dim}")

    def family(self) -> "Shape":
        """The shape without rows and capacity: programs whose searched structures fit each other."""
        return replace(self, batch=0, capacity=0)


# A profile where the hand-written reference took at most this share of the searched μGraph's time decides a
# larger capacity of the same rows and heads without a search (``AttentionSearch._carried``). What H100 profiles
# measured (Llama-3.1-8B, Llama-3.2-3B, Mistral-7B, Qwen2.5-7B; 256–512 slots, b1 and b8): 0.17–0.65.
CARRY_MARGIN = 0.8


@dataclass(frozen=True)
class Decision:
    """Which kernels run a shape's decode attention, and why; with the profile's times where one ran."""

    kernel: str   # "searched" or "hand-written"
    why: str
    searched_us: float | None = None
    reference_us: float | None = None


class SearchedGraph:
    """The built μGraph of one ``Shape``; called with one step's tensors (``attention_launch``'s layout)."""

    def __init__(self, shape: Shape, choice, compiled):
        self.shape, self.choice, self.compiled = shape, choice, compiled
        # every input given per call; planned once (``CompiledGraph.bind``), so an eager step pays no per-call
        # input checks or environment building: ``Shape`` already fixes what a call hands in
        self.run = compiled.bind([None] * len(choice.graph.inputs))
        # the cache writes a kernel stores launch nothing (store_through), nor does the length its last kernel counts
        self.launches = compiled.launches
        # what the last kernel counts where the caller has no counter of its own (a cache indexed by HF's
        # cache_position): advancing it changes nothing anyone reads
        self._scratch = torch.zeros(1, dtype=torch.int64, device=compiled.device)
        self.kernels = sum(n.op == "customized" for n in choice.graph.nodes)

    def describe(self) -> str:
        where = {"cache": "from the kernel cache", "search": "searched", "reinstantiated":
                 "re-instantiated from a searched structure", "fallback": "the program as library ops"}
        return (f"μGraph {where.get(self.choice.source, self.choice.source)}: {self.kernels} generated kernels, "
                f"{self.launches} launches")

    def __call__(self, q, k, v, cos, sin, keys, values, pos, mask, norms=None, advance=None) -> torch.Tensor:
        """The attention output [b, Hq·d]; ``advance``: the cache's device-side length, which the graph adds one to
        (``CompiledGraph(counter="pos")``: in its last kernel where that is legal)."""
        s = self.shape
        b, d = s.batch, s.head_dim
        rot = [t.view(t.shape[0], 1, 1, d).expand(b, 1, 1, d) for t in (cos, sin)]
        ins = [q.view(b, s.q_heads, 1, d), k.view(b, s.kv_heads, 1, d), v.view(b, s.kv_heads, 1, d), *rot,
               keys, values, pos.view(1), additive_mask(mask, b, keys.dtype, pos)]
        if s.qk_norm_eps is not None:
            ins += list(norms)
        return self.run(*ins, self._scratch if advance is None else advance)[0].view(b, s.q_heads * d)


class _Additive:
    """The last mask ``additive_mask`` converted: the layers of one step share one mask (each reads its own view
    of HF's 4D mask), so the key is the memory viewed and the view, and the conversion runs once a step, not
    once a layer. Holding that memory keeps a later step's mask from being allocated at the same address.
    (Not the view's ``_base``: under ``torch.inference_mode`` views have none, and every layer missed.) A mask
    written in place from step to step (``step_mask.StepMask``: one buffer, a column more a step) keeps its
    address, so the key also holds its version counter, which every in-place write advances."""
    storage = key = out = None


def _version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter; None for an inference tensor, which has none (and is never written
    in place: a step's mask of that kind is a new tensor)."""
    try:
        return t._version
    except RuntimeError:
        return None


def additive_mask(mask: torch.Tensor, rows: int, dtype: torch.dtype, pos: torch.Tensor) -> torch.Tensor:
    """The program's mask [rows, 1, 1, L] in ``dtype``: 0 where the step's [rows or 1, L] mask attends (bool:
    True; additive: 0) and the slot is at most ``pos``, the dtype's minimum elsewhere (as HF's eager attention
    adds it). The bound at ``pos`` matters: a sliding layer's mask comes lifted (``window_layers``) for kernels
    that stop at the position themselves, and the program reads every slot. Every layer of a step writes the
    same position while it runs these kernels (a sliding layer only until its window is full), so the first
    layer's ``pos`` serves the step."""
    storage = mask.untyped_storage()
    key = (storage.data_ptr(), tuple(mask.shape), mask.stride(), mask.storage_offset(), _version(mask), mask.dtype,
           rows, dtype)
    if _Additive.key == key:
        return _Additive.out
    attends = mask if mask.dtype == torch.bool else mask == 0
    attends = attends & (torch.arange(mask.shape[-1], device=mask.device) <= pos.view(1))
    out = torch.zeros(rows, mask.shape[-1], dtype=dtype, device=mask.device)
    out.masked_fill_(~attends.expand(rows, -1), torch.finfo(dtype).min)
    _Additive.storage, _Additive.key, _Additive.out = storage, key, out.view(rows, 1, 1, -1)
    return _Additive.out


def unsearchable(x: torch.Tensor, cos: torch.Tensor, mask, head_dim: int) -> str | None:
    """Why this step is not one the program describes (the hand-written kernels then run), or None."""
    if cos.shape[-1] != head_dim:
        return f"RoPE on {cos.shape[-1]} of {head_dim} dims of each head (the program rotates the whole head)"
    if cos.dtype != x.dtype:
        return f"cos / sin in {cos.dtype} with a {x.dtype} model (the program's RoPE is in the model dtype)"
    if mask is None:
        return "no attention mask (the program masks the static cache's unwritten slots)"
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {x.dtype}"
    return None


class AttentionSearch:
    """The searched decode attention of one ``patch()``: one built μGraph and one decision per shape,
    shared by every attention module of that shape. ``mode`` is ``PatchOptions.attention``; ``deterministic``:
    its cross-block sums in a fixed order (``PatchOptions.deterministic``)."""

    def __init__(self, cache, budget, pdl: bool, mode: str = "profiled", deterministic: bool = False):
        self.cache, self.pdl, self.mode, self.deterministic = cache, pdl, mode, deterministic
        self.budget = _attention_budget(budget)
        self._graphs: dict[Shape, SearchedGraph | str] = {}
        self._seeds: dict[Shape, object] = {}   # Shape.family() -> SearchResult, re-instantiated at new shapes
        self._decisions: dict[Shape, Decision] = {}
        self._profiles: dict[Shape, tuple[float, float]] = {}  # (searched µs, reference µs) this process measured

    def graph(self, shape: Shape, device: torch.device) -> SearchedGraph | str:
        """The built μGraph of ``shape`` (choosing it the first time), or why there is none."""
        if shape not in self._graphs:
            self._graphs[shape] = self._build(shape, device)
        return self._graphs[shape]

    def _build(self, shape: Shape, device: torch.device) -> SearchedGraph | str:
        from superopt.runtime import compile_graph

        from .. import backends, optimize, progress

        program = shape.program()
        # on the CPU (the Triton interpreter) the search still targets sm_90, as patch() does for sites
        arch = backends.arch_of(device) if device.type == "cuda" else "sm_90"
        key = self._key(shape, program, device)
        t0 = time.perf_counter()
        try:
            # the first decode step of a new shape: a search here takes seconds to a minute
            with progress.slow(f"decode attention {_label(shape)}: choosing its μGraph (the kernel cache, else "
                               f"a stored structure, else the search)"):
                seed = self._seeds.get(shape.family()) or self._stored_seed(shape, device, arch)
                choice = optimize.choose(program, budget=self.budget, arch=arch, cache=self.cache, key=key,
                                         seed=seed, keep_structures=True, gpu=backends.gpu_name(device),
                                         pick=self._pick(program, shape, device) if device.type == "cuda" else None)
        except Exception as e:  # the hand-written kernels still run
            return f"choosing its μGraph raised {type(e).__name__}: {e}".splitlines()[0]
        if choice.result is not None:
            self._seeds.setdefault(shape.family(), choice.result)
        try:
            compiled = compile_graph(choice.graph, device=device, launch=choice.launch, pdl=self.pdl,
                                     in_place=("k_cache", "v_cache"), counter="pos", ordered_sums=self.deterministic)
        except Exception as e:
            return f"its {choice.source} μGraph did not build: {type(e).__name__}: {e}".splitlines()[0]
        built = SearchedGraph(shape, choice, compiled)
        log.info("mirage_serve: decode attention %s: %s (%.1f s)", _label(shape), built.describe(),
                 time.perf_counter() - t0)
        return built

    def _key(self, shape: Shape, program, device: torch.device):
        """The kernel-cache key of ``shape``'s program (None without a cache)."""
        from .. import backends
        from ..cache import CacheKey, versions_now
        from ..registry import short_dtype

        if self.cache is None:
            return None
        return CacheKey(digest(program), f"b{shape.batch}", short_dtype(getattr(torch, shape.dtype)),
                        backends.arch_of(device).replace("_", ""), "triton", versions_now(),
                        f"attention-b{shape.batch}-L{shape.capacity}")

    def _stored_seed(self, shape: Shape, device: torch.device, arch: str):
        """The structures an earlier process searched for ``shape``'s family at another capacity or batch (kept
        in that entry's meta, ``optimize.choose(keep_structures=True)``), as a result to re-instantiate; None
        where the cache has none (each sibling looked up costs ~1 ms, against a search of seconds to a minute)."""
        from superopt.search import SearchBudget
        from superopt.search.structures import from_json

        if self.cache is None or not isinstance(self.budget, SearchBudget):
            return None
        for other in _siblings(shape):
            entry = self.cache.get(self._key(other, other.program(), device))
            data = entry.meta.get("structures") if entry is not None else None
            if data:
                try:
                    return from_json(data, self.budget, arch)
                except ValueError:
                    continue
        return None

    def _pick(self, program, shape: Shape, device: torch.device):
        """``optimize.choose``'s profiler: the search's candidates timed on the GPU (``runtime.select``) on a
        step at the middle of the cache, the fastest that verifies kept (the cost model cannot see what a
        grid of a few blocks costs: its pick for Llama-3.1-8B's 256-slot cache ran 6x the reference)."""
        def pick(result):
            from superopt.runtime.select import Selector

            from .. import optimize
            # its build workers live for this one pick; candidates timed writing the cache in place, as they run
            selector = Selector(device, pdl=self.pdl, in_place=("k_cache", "v_cache"), ordered_sums=self.deterministic)
            try:
                ranked = selector.pick(result.candidates(), example_inputs(program, shape, device))
            finally:
                selector.close()
            timings = tuple(optimize.profile_timings(ranked))
            for r in ranked:
                ver = optimize.verify(program, r.ugraph) if r.error is None else None
                if ver is not None and ver.ok:
                    note = f"fastest of {len(ranked)} timed: {r.median_us:.1f} µs"
                    return optimize.Pick(r.ugraph, dict(r.launch), r.median_us, note, ver, timings)
            return optimize.Pick(result.best, {}, float("nan"), f"no candidate ran ({ranked[0].error})",
                                 timings=timings)
        return pick

    def decision(self, shape: Shape) -> Decision | None:
        return self._decisions.get(shape)

    def decide(self, shape: Shape, graph, timed, device: torch.device | None = None) -> Decision:
        """Which kernels run ``shape``: the searched μGraph unless there is none, the mode says otherwise,
        or ``timed(graph)`` (-> (searched µs, hand-written µs), or None where no GPU can time them) finds the
        hand-written reference faster. ``graph()`` gives the built μGraph or why there is none; it is not called
        where the mode is 'hand-written' (choosing a μGraph is a search on a cold cache: seconds to a minute), nor
        where a profile at a smaller capacity decides (``_carried``). ``device``: the model's, under which a
        profile's times are kept in the kernel cache for later processes (None: this process only)."""
        carried = self._carried(shape, device) if self.mode == "profiled" else None
        if self.mode == "hand-written":
            d = Decision("hand-written", "PatchOptions.attention='hand-written'")
        elif carried is not None:
            d = carried
        else:
            built = graph()
            if isinstance(built, str):
                d = Decision("hand-written", f"no searched μGraph: {built}")
            elif self.mode == "searched":
                d = Decision("searched", f"{built.describe()} (PatchOptions.attention='searched')")
            else:
                d = _profiled(built, lambda: timed(built))
                if d.reference_us is not None:
                    self._keep_profile(shape, d, device)
        self._decisions[shape] = d
        log.info("mirage_serve: decode attention %s runs the %s kernels: %s", _label(shape), d.kernel, d.why)
        return d

    # ------------------------------------------------------------ profiles carried to longer caches
    def _carried(self, shape: Shape, device: torch.device | None) -> Decision | None:
        """The reference, unsearched, where the profile nearest below ``shape``'s capacity (same rows, heads,
        dtype: this process's or one kept in the cache) timed it at most ``CARRY_MARGIN`` of the searched
        μGraph's time; None where no such profile exists or the nearest one was closer (then the shape is
        chosen and profiled as usual). Why a longer cache keeps the order: the searched program reads every
        slot of the static cache, masked, and the reference stops at the position, so the searched μGraph's
        reads grow with the capacity at least as fast as the reference's, and neither launches more."""
        below = {c for c in _SIBLING_CAPACITIES if c < shape.capacity}
        below |= {s.capacity for s in self._profiles if s.capacity < shape.capacity
                  and replace(s, capacity=shape.capacity) == shape}
        for capacity in sorted(below, reverse=True):
            other = replace(shape, capacity=capacity)
            times = self._profiles.get(other) or self._stored_profile(other, device)
            if times is None:
                continue
            searched, reference = times
            if reference > CARRY_MARGIN * searched:
                return None
            return Decision("hand-written", f"the hand-written reference timed {reference:.1f} µs against the "
                                            f"searched μGraph's {searched:.1f} µs at cache {capacity} with these rows "
                                            f"and heads; a longer cache keeps that order, so cache "
                                            f"{shape.capacity} is not searched")
        return None

    def _keep_profile(self, shape: Shape, d: Decision, device: torch.device | None) -> None:
        """Remember a profile's times for ``_carried``: in this process, and in the meta of ``shape``'s cache
        entry where this user signed it (``_stored_profile`` believes no other: a shipped or imported entry's times
        are anyone's claim)."""
        self._profiles[shape] = (d.searched_us, d.reference_us)
        if self.cache is None or device is None:
            return
        from ..cache import CacheWarning

        key = self._key(shape, shape.program(), device)
        try:
            with self.cache.lock(key):
                entry = self.cache.get(key, count=False)
                if entry is None or not entry.signed:
                    return
                times = {"searched_us": round(d.searched_us, 2), "reference_us": round(d.reference_us, 2),
                         "device": _device_name(device)}
                self.cache.put(key, replace(entry, origin="", meta={**entry.meta, "versus_reference": times}),
                               replace_existing=True)
        except (OSError, ValueError, TimeoutError) as e:  # a profile not kept must not fail the step
            warnings.warn(f"mirage_serve cache: the attention profile of {key.dirname()} not kept ({e})",
                          CacheWarning, stacklevel=2)

    def _stored_profile(self, shape: Shape, device: torch.device | None) -> tuple[float, float] | None:
        """(searched µs, reference µs) an earlier process kept for ``shape`` on this kind of device, or None."""
        if self.cache is None or device is None:
            return None
        entry = self.cache.get(self._key(shape, shape.program(), device), count=False)
        times = entry.meta.get("versus_reference") if entry is not None and entry.signed else None
        if not isinstance(times, dict) or times.get("device") != _device_name(device):
            return None
        return float(times["searched_us"]), float(times["reference_us"])


def _device_name(device: torch.device) -> str:
    from .. import backends
    return backends.gpu_name(device) or device.type


def _profiled(graph: SearchedGraph, timed) -> Decision:
    """The faster of the searched μGraph and the hand-written reference, as ``timed()`` measures them."""
    try:
        us = timed()
    except Exception as e:  # e.g. a μGraph that cannot be captured: the reference runs
        return Decision("hand-written", f"timing the searched μGraph raised {type(e).__name__}: {e}".splitlines()[0])
    if us is None:
        return Decision("searched", f"{graph.describe()} (not timed: no GPU)")
    if us[1] < us[0]:
        return Decision("hand-written", f"the hand-written reference timed faster: {us[1]:.1f} µs against the "
                                        f"searched μGraph's {us[0]:.1f} µs ({graph.describe()})", *us)
    return Decision("searched", f"{graph.describe()}: {us[0]:.1f} µs, the hand-written reference {us[1]:.1f} µs",
                    *us)


# Where ``_stored_seed`` looks: the decode buckets, and the capacities the owned caches take (multiples of
# ``cache_pool.LENGTH_QUANTUM``) up to 8k tokens, the nearest first.
_SIBLING_BATCHES = (1, 2, 4, 8, 16)
_SIBLING_CAPACITIES = range(LENGTH_QUANTUM, 8192 + 1, LENGTH_QUANTUM)


def _siblings(shape: Shape) -> list[Shape]:
    """Other shapes of ``shape``'s family, the same batch and the nearest capacity first."""
    batches = [shape.batch] + [b for b in _SIBLING_BATCHES if b != shape.batch]
    caps = sorted(_SIBLING_CAPACITIES, key=lambda c: abs(c - shape.capacity))
    return [replace(shape, batch=b, capacity=c) for b in batches for c in caps
            if (b, c) != (shape.batch, shape.capacity)]


def _attention_budget(budget):
    """The patch's search budget with room for the attention kernel's block ops (0 stays 0: no search)."""
    if budget == 0:
        return 0
    from superopt.search import SearchBudget
    budget = budget if budget is not None else SearchBudget()
    return replace(budget, max_block_ops=max(budget.max_block_ops, ATTENTION_BLOCK_OPS))


def _label(shape: Shape) -> str:
    return (f"[{shape.batch} rows, {shape.q_heads}/{shape.kv_heads} heads × {shape.head_dim}, "
            f"cache {shape.capacity}, {shape.dtype}]")


def example_inputs(program, shape: Shape, device: torch.device) -> list[torch.Tensor]:
    """Inputs of the attention program for timing: random values, the position at the middle of the cache, the
    mask attending up to it."""
    from superopt.runtime.dtypes import TORCH_DTYPES

    g = torch.Generator(device=device).manual_seed(0)
    xs = []
    for v in program.inputs:
        if v.name == "pos":
            xs.append(torch.full((1,), shape.capacity // 2, dtype=torch.int64, device=device))
        elif v.name == "mask":
            m = torch.zeros(v.type.shape, dtype=TORCH_DTYPES[v.type.dtype], device=device)
            m[..., shape.capacity // 2 + 1:] = torch.finfo(m.dtype).min
            xs.append(m)
        else:
            xs.append(torch.randn(v.type.shape, device=device, generator=g).to(TORCH_DTYPES[v.type.dtype]))
    return xs


def time_both(searched, handwritten, keys: torch.Tensor, values: torch.Tensor) -> tuple[float, float]:
    """Microseconds of ``searched(keys, values, pos, advance)`` and ``handwritten(...)`` on copies of the
    layer's cache (more than L2 in all, so each replay reads from memory as a decode step does), at the
    middle of the cache, each replayed from a CUDA graph (``superopt.runtime.timing``). ``advance`` is a
    scratch length counter starting at the position: counting the step is part of both (in the reference's
    second kernel, after the searched μGraph), and the cache's own counter is not touched."""
    from superopt.runtime.timing import rotated_sets, time_call

    pos = torch.full((1,), keys.shape[2] // 2, dtype=torch.int64, device=keys.device)
    scratch = pos.clone()  # the reference's second kernel reads the position from it, as from the cache's own
    sets = [s + [pos, scratch] for s in rotated_sets([keys, values])]
    return time_call(searched, sets, graph=True, reps=10), time_call(handwritten, sets, graph=True, reps=10)
