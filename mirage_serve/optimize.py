"""Choose and verify the μGraph for a Lax program: cache, then search, else the program itself.

The one place patch() meets the superoptimizer, so swapping the search or the verifier in or out
touches this file only. A Lax program is itself a valid μGraph (library kernels, one launch per
op), so when the search is off (``budget=0``) or finds nothing, the program runs as it is; it is
then trivially equivalent to itself.
"""
from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, replace

from superopt.codegen.launch import read_launches, stored_launches
from superopt.ir import KernelGraph, digest, from_text, to_text
from superopt.verify.precision import precision_violations
from superopt.verify.upcast import upcast

from . import progress, verify_parallel
from .cache import CacheEntry, CacheWarning
from .cache.builds import render_digest
from .cache.gpu_rows import for_gpu, timed_elsewhere


# The torch backend gains no speed from a better μGraph; a short search still exercises the path.
# Bounded by states, not seconds, so a loaded machine finds what an idle one does (a Llama k_proj
# search takes ~37,000 states, 3 s on a 2-core CPU).
CPU_SEARCH_STATES = 200_000


@dataclass(frozen=True)
class Choice:
    graph: KernelGraph
    source: str        # "cache", "search", "reinstantiated" or "fallback"
    note: str          # why, for the report
    seconds: float
    result: object = None  # the SearchResult, to re-instantiate its structures at other buckets
    launch: dict | None = None  # kernel name -> superopt.codegen.launch.Launch when profiled
    profile: str = ""      # what the profiler measured, for the report
    verification: "Verification | None" = None  # already verified against this program (None: not yet)
    entry: object = None   # the CacheEntry of a cache hit (its stored build is reused, not read again)


@dataclass(frozen=True)
class Pick:
    """What a profiler chose among a search result's candidates (``choose(..., pick=)``)."""
    graph: KernelGraph
    launch: dict
    median_us: float
    note: str
    verification: "Verification | None" = None  # the pick's, when the profiler verified it
    timings: tuple = ()  # every candidate timed (profile_timings), kept with the entry


@dataclass(frozen=True)
class Verification:
    ok: bool
    verdict: str
    seconds: float


def default_budget(budget, backend: str):
    """``search_budget=None``: the search's own default on GPU, its block searches spread over a worker process per
    core but one (as the verification's, ``verify_parallel``), and a short search in this process on the torch
    backend. The workers change how fast a search ends, not what it finds: each block search keeps its own state
    budget and the results are merged in key order (``superopt.search.driver``). Qwen3-8B's decode attention at
    b1: 48.9 s of block searches in one process, 30.4 s in two, on 2 cores, the same 31 candidates."""
    if budget is not None:
        return budget
    from superopt.search import SearchBudget  # the search and the verifier load on first use

    if backend == "torch":
        return SearchBudget(max_seconds=float("inf"), max_states=CPU_SEARCH_STATES)
    return SearchBudget(workers=max(1, verify_parallel.cores() - 1))


def choose(program: KernelGraph, *, budget, arch: str, cache=None, key=None, seed=None, pick=None,
           research: bool = False, keep_structures: bool = False, gpu: str = "", retime: bool = False) -> Choice:
    """The μGraph to run for ``program``. ``budget=0`` skips the search (tests, quick starts).

    ``cache`` is a ``mirage_serve.cache.KernelCache`` and ``key`` its ``CacheKey`` for this program,
    or both None; searched winners are stored (the fallback is the program itself). ``seed``: the
    search result of the same site at another bucket, whose structures are re-instantiated at this
    shape (and re-verified by the search) instead of searching again. ``pick(result) -> Pick``:
    times the result's candidates on the device and returns the fastest (None: the search's best);
    its launch configuration and timings are stored with the entry, so a cache hit needs no profiling.
    ``research`` (with ``pick``): a hit in the shipped cache is searched again, its μGraph one more
    candidate for the profiler, and the winner is stored (``PatchOptions.research``) — a search changed
    since the shipped entry was made can then only replace it with something measured faster.
    ``keep_structures``: a searched or re-instantiated entry also keeps its result's designs
    (``meta["structures"]``, ``superopt.search.structures``), for a later process's ``seed``.
    ``gpu``: the name of the GPU ``pick`` times on; an entry records it (``timed_on``), and a hit this user did
    not sign runs the launch its row for this GPU holds, if any (``cache.gpu_rows``). ``retime`` (with
    ``pick``): such a hit whose launch was timed on another GPU has its launches timed again here
    (``PatchOptions.retime_launches``), its μGraph kept.
    """
    timing = _Timing(pick, gpu, retime and pick is not None)
    if cache is None or key is None:
        return _choose(program, budget, arch, None, None, seed, timing, False, keep_structures)
    # Concurrent patchers of one model: one searches each program, the others wait, then hit.
    with cache.lock(key):
        return _choose(program, budget, arch, cache, key, seed, timing, research and pick is not None,
                       keep_structures)


@dataclass(frozen=True)
class _Timing:
    """How ``choose`` times launches: the profiler (None off the GPU), the GPU's name, and whether a hit timed
    on another GPU is timed again."""
    pick: object
    gpu: str = ""
    retime: bool = False

    def stamp(self, meta: dict) -> dict:
        """``meta`` of a launch the profiler just chose, naming the GPU it was timed on."""
        return {**meta, "timed_on": self.gpu} if self.gpu else meta


def _hit(program: KernelGraph, entry, cache, key, timing: _Timing, t0: float) -> "Choice | None":
    """The Choice a cache entry gives; None when it fails verification (rejected, warned: the
    caller then searches as on a miss).

    A signed entry (this user's own writing, ``CacheEntry.signed``) is believed as stored: verdict,
    launch, binaries. Any other (shipped, imported, written by someone else) is data: its μGraph is
    verified against ``program`` now, whatever verdict it claims, after the dtype rule (ops it
    computes narrower than the program are widened by ``superopt.verify.upcast``, else it is
    rejected); its launch is this GPU's row where it has one (``cache.gpu_rows``), kept only while
    the code generator renders the same source for it (``render_sha256``), else profiled again
    where a profiler is given (the GPU), or left to the renderer's default. What passes is stored
    signed, so the next patch believes it without verifying."""
    note = f"cache entry {key.dirname()}"
    try:
        graph = from_text(entry.ugraph_text)
    except ValueError as e:
        return _reject(cache, key, entry, f"its μGraph does not parse ({e})")
    if entry.signed:   # its launch is the one its binaries were built for, whatever GPU it names
        launch, profile = _stored_launch(entry.meta.get("launch")), entry.meta.get("profile", "")
        ver = (Verification(True, f"verified when cached: {entry.meta.get('verdict', '')}", 0.0)
               if entry.meta.get("verified") is True else None)
        return Choice(graph, "cache", note, time.perf_counter() - t0, None, launch, profile, ver, entry)
    with progress.slow(f"{key.label}: verifying a cached μGraph this user did not sign ({entry.origin})"):
        return _verified_hit(program, graph, entry, cache, key, timing, t0, note)


def _verified_hit(program, graph, entry, cache, key, timing: _Timing, t0: float, note: str) -> "Choice | None":
    """``_hit`` for an entry this user did not sign: the dtype rule, the launch check, the verification."""
    meta = for_gpu({k: v for k, v in entry.meta.items() if k not in ("verified", "verdict")}, timing.gpu)
    launch, profile = _stored_launch(meta.get("launch")), meta.get("profile", "")
    ver = None
    current = _launch_stands(key, meta, graph, launch)
    try:
        graph, widened = upcast(program, graph)
        narrow = precision_violations(program, graph)
    except Exception as e:   # a malformed block graph: nothing in it is used
        return _reject(cache, key, entry, f"its μGraph cannot be read ({type(e).__name__}: {e})")
    if narrow:   # what a fresh search would prune ("precision") never runs from a cache either
        return _reject(cache, key, entry, f"it computes narrower than the program: {'; '.join(narrow)}")
    if widened:
        # The precision rule, applied as the search applies it: the entry's narrow arithmetic is
        # computed at the program's width (superopt.verify.upcast). Same kernels and tiling, so a
        # launch profiled for the entry's own rendering stays; the stored digest becomes this one's.
        note += f"; {len(widened)} op(s) widened to the program's precision"
        if current and launch is not None and key.backend == "triton":
            meta["render_sha256"] = render_digest(graph, launch)
    # a μGraph with no generated kernel (the program itself) has no launch to time
    timed = timing.pick is not None and bool(graph.customized_nodes())
    elsewhere = current and timing.retime and timed and timed_elsewhere(meta, timing.gpu)
    if not current or elsewhere:
        # profiled on code the generator no longer renders, or on another GPU: the μGraph stays, its launches
        # are timed again
        why = (f"timed on {meta.get('timed_on') or 'a GPU it does not name'}" if elsewhere
               else "generated code changed")
        launch, profile = None, ""
        for stale in ("launch", "render_sha256", "median_us", "profile", "timings", "timed_on"):
            meta.pop(stale, None)
        note += f"; launch profiled again ({why})" if timed else "; stale launch dropped"
        if timed:
            chosen = timing.pick(_Only(graph))
            if chosen.graph == graph and chosen.launch:
                launch, profile, ver = chosen.launch, chosen.note, chosen.verification
                meta.update(launch=stored_launches(launch), median_us=chosen.median_us,
                            profile=profile, render_sha256=render_digest(graph, launch))
                if chosen.timings:
                    meta["timings"] = [list(t) for t in chosen.timings]
                meta = timing.stamp(meta)
    ver = ver or verify(program, graph)
    if not ver.ok:
        return _reject(cache, key, entry, f"it failed verification against the program: {ver.verdict}")
    meta.update(verified=True, verdict=ver.verdict)
    cache.put(key, CacheEntry(to_text(graph) if widened else entry.ugraph_text, {}, {}, meta),
              replace_existing=entry.origin == "user")
    return Choice(graph, "cache", note + "; verified now", time.perf_counter() - t0, None, launch, profile, ver,
                  entry)


def _reject(cache, key, entry, why: str) -> None:
    cache.stats.rejected.append((key.dirname(), why))
    if entry.origin == "user":   # make room for what the search finds (the caller holds the lock)
        cache.discard(key)
    warnings.warn(f"mirage_serve cache: entry {key.dirname()} rejected: {why}; searching as on a miss",
                  CacheWarning, stacklevel=4)
    return None


class _Only:
    """A one-candidate result for the profiler: a cached μGraph whose launches are timed again
    (``incumbent``: every launch configuration of it is swept)."""

    def __init__(self, graph: KernelGraph):
        self.best = self.incumbent = graph

    def candidates(self) -> list[KernelGraph]:
        return [self.best]


class _WithIncumbent:
    """A search result whose candidates start with the μGraph a cache entry held (research mode)."""

    def __init__(self, result, incumbent: KernelGraph):
        self.result, self.incumbent = result, incumbent

    def candidates(self) -> list[KernelGraph]:
        return [self.incumbent] + [g for g in self.result.candidates() if g != self.incumbent]

    def __getattr__(self, name):
        return getattr(self.result, name)


def _choose(program: KernelGraph, budget, arch: str, cache, key, seed, timing: _Timing, research: bool,
            keep_structures: bool = False) -> Choice:
    t0 = time.perf_counter()
    incumbent, pick = None, timing.pick

    def done(graph, source, note, result=None):
        launch, profile, meta, ver = None, "", {"program_digest": digest(program), "source": source}, None
        if source in ("search", "reinstantiated"):
            if pick is not None:
                chosen = pick(result if incumbent is None else _WithIncumbent(result, incumbent))
                graph, launch, profile, ver = chosen.graph, chosen.launch, chosen.note, chosen.verification
                meta = timing.stamp({**meta, "launch": stored_launches(launch), "median_us": chosen.median_us,
                                     "profile": profile})
                if chosen.timings:
                    meta["timings"] = [list(t) for t in chosen.timings]
            ver = ver or verify(program, graph)
            meta.update(verified=ver.ok, verdict=ver.verdict)
            if keep_structures:
                from superopt.search.structures import to_json
                meta["structures"] = to_json(result)
            if launch and key is not None and key.backend == "triton":
                meta["render_sha256"] = render_digest(graph, launch)
            # Only a verified μGraph is stored, signed: a signed hit is then believed without
            # verifying again (only this user's process can have written it; mirage_serve.cache).
            if ver.ok and cache is not None and key is not None:
                # research: the shipped hit was verified and stored first; the search's winner replaces it
                cache.put(key, CacheEntry(to_text(graph), {}, {}, meta), replace_existing=incumbent is not None)
        return Choice(graph, source, note, time.perf_counter() - t0, result, launch, profile, ver)

    cached = None
    if cache is not None and key is not None:
        entry = cache.get(key)
        cached = _hit(program, entry, cache, key, timing, t0) if entry is not None else None
        if cached is not None:
            # Research re-searches shipped entries only: a user entry's key holds the digest of the
            # superopt source that made it, so it is this search's own result already. A shipped entry
            # holding the unfused program is searched again even without research (``unproven_program``).
            if ((not research or entry.origin != "shipped")
                    and not unproven_program(program, cached.graph, entry, pick is not None)):
                return cached
            incumbent = cached.graph

    def fallback(note: str, result=None, searched: bool = True) -> Choice:  # research keeps what it could not beat
        if cached is None:
            return done(program, "fallback", note, result)
        if searched and incumbent == program and cache is not None and key is not None:
            # an unproven program searched again without a result: say so in the user's entry, or every
            # later patch would search it again (``unproven_program``)
            meta = {**cached.entry.meta, "unbeaten": note}
            cache.put(key, CacheEntry(cached.entry.ugraph_text, {}, {}, meta), replace_existing=True)
        return cached

    if budget == 0:
        return fallback("search disabled (search_budget=0)", searched=False)
    from superopt.search import superoptimize
    what = key.label if key is not None else program.name
    timed = ", its candidates timed on the GPU" if pick is not None else ""
    if seed is not None:  # instant without a profiler: announced only where its candidates are timed
        with progress.slow(f"{what}: re-instantiating a structure searched at another shape{timed}") \
                if pick is not None else nullcontext():
            try:
                result = seed.reinstantiate(program)
                fits = any(g != program for g, _ in result.ranked)
            except Exception:  # a structure that does not fit this shape: search this one afresh
                fits = False
            # Only the unfused program left (no structure fits this shape, e.g. a split of 1 row):
            # a search of its own may still fuse it. Where structures fit, the program may still
            # rank first (as it did at the searched bucket); the profiler, if any, decides.
            if fits:
                return done(result.best, "reinstantiated", "structures of another bucket", result)
    with progress.slow(f"{what}: searching its μGraph{timed}"):
        try:
            kwargs = {"arch": arch} if budget is None else {"arch": arch, "budget": budget}
            result = superoptimize(program, **kwargs)
            best = _best(result)
        except Exception as e:  # a search failure must not stop the patch: the program still runs
            return fallback(f"search failed: {type(e).__name__}: {e}")
        if best is None:
            return fallback("search found no μGraph", result)
        return done(best, "search", "searched", result)


def unproven_program(program: KernelGraph, graph: KernelGraph, entry, profiled: bool) -> bool:
    """Whether a cache hit holds the program itself (library kernels, nothing fused) without the
    GPU's word that nothing beat it: searched again once, its μGraph the incumbent as in research
    mode, and the winner stored in the user's cache (with its time, so the check passes from then).

    A shipped entry's claim was made by an older search, and the search has grown (Gemma's gelu_tanh
    gate/up: 3 candidates timed then, the program won at 34.8 µs on the H100; 33 now, the best one
    kernel at 15.2 µs). A user entry never timed on the GPU (no ``median_us``: written where no
    profiler ran) says nothing either, once a profiler (``profiled``) can decide: one such entry held
    Gemma-3-1B's gate/up at 16 library launches through a whole session's benches, 38 µs a layer
    where the search's best takes 13. A search that fails or finds nothing marks the user's entry
    ``unbeaten`` (``_choose``), so it is tried once, not on every patch."""
    if graph != program or "unbeaten" in entry.meta:  # searched again already, and nothing came of it
        return False
    return entry.origin == "shipped" or (profiled and entry.meta.get("median_us") is None)


# Research mode replaces a shipped μGraph only when a new one is at least 5% faster: below that,
# timing noise and in-graph effects decide. The tenth session's research run replaced Llama-3.1-8B's
# batch-8 gate/up kernel on a 2.5% gain measured alone, and the decode step got 4% slower.
REPLACE_MARGIN = 0.95


def incumbent_first(ranked: list, incumbent: KernelGraph, margin: float = REPLACE_MARGIN) -> list:
    """The profiler's ``ranked`` results (fastest first), with the ``incumbent``'s moved to the front
    unless the fastest beats it by ``margin``."""
    inc = next((r for r in ranked if r.ugraph == incumbent and r.error is None), None)
    if inc is None or not ranked or ranked[0] is inc or ranked[0].median_us < margin * inc.median_us:
        return ranked
    return [inc] + [r for r in ranked if r is not inc]


def _stored_launch(stored) -> dict | None:
    """A cache entry's launch table (``superopt.codegen.launch``'s stored form, every entry since the
    first); one this build cannot read leaves the renderer's defaults, which are always valid."""
    try:
        return read_launches(stored)
    except ValueError:
        return None


def profile_timings(ranked) -> list[list]:
    """Every candidate the GPU profiler timed (``superopt.runtime.profile.ProfileResult``s) as
    ``[layout, launch, µs, cost model µs]`` (or ``[layout, error]``), best first: what a cache entry
    keeps of the profiling that chose it, to compare the cost model's ranking with the GPU's later
    without timing anything again."""
    from superopt.ir import layout
    from superopt.runtime.profile import config_label
    from superopt.search.cost import graph_cost

    out = []
    for r in ranked:
        if r.error is not None and r.median_us == float("inf"):
            out.append([layout(r.ugraph), r.error[:160]])
            continue
        launch = " ".join(sorted({config_label(c) for c in r.launch.values()})) or "default"
        out.append([layout(r.ugraph), launch, round(r.median_us, 2), round(graph_cost(r.ugraph), 2)])
    return out


def verification_of(program: KernelGraph, choice: Choice, cache=None, key=None) -> Verification:
    """``choice``'s verification against ``program``, verifying now if it has none yet.

    A hit on a signed entry without a stored verdict is verified here, and the verdict is written
    back (signed) when it passes, so the next patch believes it: re-verifying Llama-3-8B's 12
    programs took ~20 s of every warm patch on the H200. (Unsigned hits are verified in `choose`.)
    """
    if choice.verification is not None:
        return choice.verification
    ver = verify(program, choice.graph)
    if ver.ok and choice.source == "cache" and cache is not None and key is not None:
        _stamp(cache, key, ver)
    return ver


def _stamp(cache, key, ver: Verification) -> None:
    with cache.lock(key):
        entry = cache.get(key, count=False)
        if entry is None or not entry.signed or entry.meta.get("verified") is True:
            return
        new = replace(entry, meta={**entry.meta, "verified": True, "verdict": ver.verdict}, origin="")
        cache.put(key, new, replace_existing=entry.origin == "user")


def _best(result):
    """The winner of a SearchResult, or None when it ranked nothing."""
    return result.best if getattr(result, "ranked", True) else None


def _launch_stands(key, meta: dict, graph: KernelGraph, launch) -> bool:
    """Whether a cache entry's stored launch choice still applies to its μGraph ``graph`` (as
    stored): none stored, not Triton, or the code generator still renders what it was profiled on."""
    return launch is None or key.backend != "triton" or meta.get("render_sha256") == render_digest(graph, launch)


def prefetch(program: KernelGraph, entry, key=None, pdl: bool = False, target=None, gpu: str = "",
             ordered_sums: bool = False) -> None:
    """Start verifying a cache entry's μGraph against ``program`` in the background
    (``verify_parallel.prefetch``); ``_hit``'s ``verify`` then collects the result instead of
    running the check. With a ``target`` (the GPU's ``GPUTarget``) and a launch ``_hit`` will keep,
    the kernels are compiled first in the same workers (``pdl``: dependent launch as the build
    resolves it; ``ordered_sums``: as ``PatchOptions.deterministic`` builds it), so the build after a passed check
    compiles nothing (``gpu``: the GPU's name, whose row of the entry ``_hit`` will run). Nothing is believed, run or stored here."""
    try:
        stored = from_text(entry.ugraph_text)
        graph, _ = upcast(program, stored)   # what _hit will verify
        if precision_violations(program, graph):
            return
        meta = for_gpu(entry.meta, gpu)
        launch = _stored_launch(meta.get("launch"))
        kept = (launch is not None and key is not None and key.backend == "triton"
                and _launch_stands(key, meta, stored, launch))
    except Exception:
        return   # _hit rejects it
    job = (to_text(graph), launch, pdl, target, ordered_sums) if kept and target is not None else None
    verify_parallel.prefetch(program, graph, compile_job=job)


def verify(program: KernelGraph, ugraph: KernelGraph) -> Verification:
    """Finite-field equivalence of ``ugraph`` to ``program`` (trivial when they are one graph)."""
    t0 = time.perf_counter()
    if ugraph == program:
        return Verification(True, "identical (the μGraph is the program)", time.perf_counter() - t0)
    v = verify_parallel.check(program, ugraph)   # check_equivalent, its trials over processes when large
    ok = bool(getattr(v, "equivalent", v))
    return Verification(ok, str(v), time.perf_counter() - t0)
