"""Prepare one site for swapping: extract its program, choose and verify a μGraph, build, self-check.

Nothing here touches the model: a prepared site is a `SiteRuntime` that patching.install installs
later. Work is shared within one patch() call: extraction once per structural signature and
bucket (all layers of a model share it), choice / verification / build once per program digest.
Any failure raises `SiteError` with the reason the report shows; the site then stays original.
"""
from __future__ import annotations

import copy
from dataclasses import replace
import time

import torch

from superopt.codegen.launch import chained
from superopt.ir import digest
from superopt.ir.tiling import reduced_axes
from superopt.lax.extract import ExtractError, Extracted, extract
from superopt.lax.rows import RowsError, with_rows

from .. import backends, cost_fit, optimize
from ..options import PatchOptions
from .pairing import Pairing, merge_twins, twins
from ..registry import short_dtype
from ..report import Counts, SiteReport
from ..site_kernel import BucketKernel, bound_call
from .sites import NormSite, ProjSite, signature, site_module, site_parts, stacked_widths, unsupported_layers

# docs/conventions.md tolerance table: relative Frobenius error against a float64 reference.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TF32_TOLERANCE = 5e-4  # fp32 on GPU backends, whose matmuls may use tf32


def tolerance(dtype: torch.dtype, on_gpu: bool) -> float | None:
    """The tolerance table's entry for ``dtype`` (None if it has none); fp32 on a GPU may use tf32."""
    return TF32_TOLERANCE if dtype == torch.float32 and on_gpu else TOLERANCE.get(dtype)


class SiteError(Exception):
    pass


class SiteRuntime:
    """Runs a site's kernel on activations ``x: [..., D]`` with at most ``max(buckets)`` rows (and,
    for a projection with the residual fused in, the residual ``r: [..., residual_dim]``)."""

    def __init__(self, dim: int, dtype: torch.dtype, device: torch.device, kernels: dict[int, BucketKernel],
                 residual_dim: int | None = None):
        self.dim, self.dtype, self.device = dim, dtype, device
        self.residual_dim = residual_dim
        self.kernels = dict(sorted(kernels.items()))
        self.max_rows = max(self.kernels)
        self.differentiable = all(k.executor.differentiable for k in self.kernels.values())
        # per number of rows m (1..max_rows): (bucket rows, call taking the [rows, D] activations)
        calls = {b: bound_call(k) for b, k in self.kernels.items()}
        self._by_rows = [None] + [next((b, calls[b]) for b in self.kernels if b >= m)
                                  for m in range(1, self.max_rows + 1)]

    def eligible(self, module: torch.nn.Module, x, r=None) -> bool:
        if module.training or not isinstance(x, torch.Tensor) or x.dim() < 1:
            return False
        if x.dtype != self.dtype or x.device != self.device or x.shape[-1] != self.dim:
            return False
        if not 1 <= x.numel() // self.dim <= self.max_rows:
            return False  # prefill-sized inputs run the original module
        if self.residual_dim is not None:  # the residual: same rows, the projection's output size
            if not isinstance(r, torch.Tensor) or r.dtype != self.dtype or r.device != self.device:
                return False
            if r.shape[:-1] != x.shape[:-1] or r.shape[-1] != self.residual_dim:
                return False
            if torch.is_grad_enabled() and r.requires_grad and not self.differentiable:
                return False
        return self.differentiable or not (torch.is_grad_enabled() and x.requires_grad)

    def run(self, x: torch.Tensor, r: torch.Tensor | None = None) -> list[torch.Tensor]:
        lead = x.shape[:-1]
        m = x.numel() // self.dim
        rows, call = self._by_rows[m]
        acts = [x.reshape(m, self.dim)]  # [M, D] (and the residual [M, N]), padded with zero rows up to the bucket
        if self.residual_dim is not None:
            acts.append(r.reshape(m, self.residual_dim))
        if rows > m:
            acts = [torch.cat([a, a.new_zeros(rows - m, a.shape[1])]) for a in acts]
            return [o[:m].reshape(*lead, o.shape[-1]) for o in call(*acts)]
        return [o.reshape(*lead, o.shape[-1]) for o in call(*acts)]


class PartsRuntime:
    """A site run as several programs on the same input (``sites.site_parts``), each computing
    some of the site's outputs; ``run`` returns them in the site's order.

    When one part computes the norm output alone (site output 0), ``run_consumers`` runs every
    other part and ``run_norm`` that one, so the caller can defer the norm (patching.install).
    ``norm_like_input`` says the norm output has the input's shape and dtype (set by the
    self-check), so a placeholder for it can be allocated before it is computed."""

    def __init__(self, parts: list[tuple[SiteRuntime, tuple[int, ...]]]):
        self.parts = parts
        first = parts[0][0]
        self.dim, self.dtype, self.device = first.dim, first.dtype, first.device
        self.kernels = first.kernels  # the buckets (every part has the same)
        produced = [i for _, outs in parts for i in outs]  # site output index, in part order
        self.order = [produced.index(k) for k in range(len(produced))]
        self.norm_part = next((p for p, outs in parts if outs == (0,)), None)
        self.consumer_parts = [p for p, _ in parts if p is not self.norm_part]
        consumed = [i for p, outs in parts if p is not self.norm_part for i in outs]
        self.consumer_order = sorted(range(len(consumed)), key=consumed.__getitem__)
        self.norm_like_input = False

    def eligible(self, module: torch.nn.Module, x) -> bool:
        # every part was prepared for the same input (dim, dtype, device, buckets, backend)
        return self.parts[0][0].eligible(module, x)

    def run(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = [o for p, _ in self.parts for o in p.run(x)]  # in part order
        return [outs[j] for j in self.order]

    def run_consumers(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Site outputs 1.. (the consumers'), in site order, without computing the norm output."""
        outs = [o for p in self.consumer_parts for o in p.run(x)]  # in part order
        return [outs[j] for j in self.consumer_order]

    def run_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_part.run(x)[0]


def _dim(head: torch.nn.Module) -> int:
    if isinstance(head, torch.nn.Linear):
        return head.in_features
    first = next((m for m in head.modules() if isinstance(m, torch.nn.Linear)), None)
    if first is not None:  # a block (a ProjSite up to its tail): its input feeds its first projection
        return first.in_features
    w = getattr(head, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        raise SiteError(f"cannot tell the input size of {type(head).__qualname__} (no 1-D weight)")
    return w.shape[0]


def _out_dim(head: torch.nn.Module) -> int:
    """The output size of a projection whose result the residual is added to."""
    if not isinstance(head, torch.nn.Linear):
        raise SiteError(f"a residual is fused only into a Linear projection, not {type(head).__qualname__}")
    return head.out_features


def activation_dims(wrapper) -> tuple[int, ...]:
    """The last dim of each activation a site module takes: ``x``, and the residual if it adds one."""
    return (_dim(wrapper.head), _out_dim(wrapper.head)) if wrapper.residual else (_dim(wrapper.head),)


class Preparer:
    """Prepares sites for one patch() call, sharing work across layers."""

    def __init__(self, backend: str, dtype: torch.dtype, buckets: tuple[int, ...],
                 search_budget, cache, options: PatchOptions, shard_tag: str = ""):
        self.backend, self.dtype, self.buckets = backend, dtype, buckets
        self.counts = Counts()  # searches, cache hits, compiles...: the pipeline adds them to the report
        self.options = options
        self.shard_tag = shard_tag  # "-tp<world>" under tensor parallelism: cache keys carry the world size
        # q/k/v as one stacked projection (patching.stacking); not on shards, whose weights are views that
        # patch() makes afresh for every site it traces, so they could not share one stacked storage
        self.stack = options.stacked_projections and not shard_tag
        self.budget, self.cache = optimize.default_budget(search_budget, backend), cache
        self._extracted: dict[tuple, Extracted] = {}
        self._built: dict[tuple, tuple] = {}  # (digest, device, plain) -> (choice, verification, executor)
        self._searched: dict[tuple, object] = {}  # (site name, signature) -> SearchResult to re-instantiate
        self._plain: dict[tuple, str] = {}  # (site name, signature) whose chosen μGraphs failed to run
        self._rng = torch.Generator().manual_seed(0)
        self._selector = None  # superopt.runtime.select.Selector, opened on the first GPU profile
        self._pairings: dict = {}  # device -> Pairing (patching.pairing)
        self._prefetched: set = set()  # (site name, signature) whose cache entries prefetch() looked up
        self._prefetch_seconds = 0.0   # prefetch's extraction and look-ups, reported by the next site prepared
        self._checked: dict[tuple, tuple] = {}  # (bucket, executor ids) a self-check ran -> the executors

    def _backend_build(self, *args, **kwargs) -> backends.Executor:
        """``backends.build`` with this call's options (dependent launch or not, ordered cross-block sums or not)."""
        return backends.build(*args, pdl=self.options.pdl, deterministic=self.options.deterministic, **kwargs)

    def close(self) -> None:
        """Stop the profiler's build workers (patch() calls this when it is done, success or not)."""
        from .. import verify_parallel
        verify_parallel.forget()
        if self._selector is not None:
            self._selector.close()
            self._selector = None

    def _pick(self, program, device):
        """``optimize.choose``'s profiler: the fastest verified candidate of a search result on ``device``."""
        def pick(result) -> optimize.Pick:
            from superopt.runtime.dtypes import TORCH_DTYPES
            from superopt.runtime.select import Selector
            if self._selector is None:
                self._selector = Selector(device, pdl=self.options.pdl, ordered_sums=self.options.deterministic)
            cands = result.candidates()
            inputs = [torch.randn(v.type.shape, generator=self._rng).to(device, TORCH_DTYPES[v.type.dtype])
                      for v in program.inputs]
            incumbent = getattr(result, "incumbent", None)  # optimize.choose's research mode
            # the shipped μGraph's launches are all timed: its best may be one the probes leave out
            ranked = self._selector.pick(cands, inputs, sweep_also=[incumbent] if incumbent is not None else [])
            timings = tuple(optimize.profile_timings(ranked))
            cost_fit.record(self.cache, backends.arch_of(device), ranked)  # the cost model learns from the GPU
            if incumbent is not None:
                ranked = optimize.incumbent_first(ranked, incumbent)
            for r in ranked:
                ver = optimize.verify(program, r.ugraph) if r.error is None else None
                if ver is not None and ver.ok:
                    base = next((x.median_us for x in ranked if x.ugraph == result.best), float("nan"))
                    fastest = min(x.median_us for x in ranked)
                    note = (f"fastest of {len(ranked)} timed: {fastest:.1f} µs "
                            f"(cost model's pick {base:.1f} µs")
                    if incumbent is not None:
                        was = next((x.median_us for x in ranked if x.ugraph == incumbent), float("nan"))
                        note += f"; the shipped μGraph {was:.1f} µs" + (", kept" if r.ugraph == incumbent else "")
                    note += ")"
                    return optimize.Pick(r.ugraph, dict(r.launch), r.median_us, note, ver, timings)
            return optimize.Pick(result.best, {}, float("nan"), f"no candidate ran ({ranked[0].error})",
                                 timings=timings)
        return pick

    def prepare(self, layer: torch.nn.Module, site: NormSite | ProjSite, sr: SiteReport,
                buckets: tuple[int, ...] | None = None) -> SiteRuntime:
        """The site's runtime at ``buckets`` (default: the call's); rows above the largest run the original."""
        buckets = buckets or self.buckets
        wrapper = site_module(layer, site)
        why = unsupported_layers(wrapper)
        if why:
            raise SiteError(why)
        dim = _dim(wrapper.head)
        device = next(wrapper.parameters()).device
        sig = signature(wrapper)
        key = (site.name, sig)
        runtime = self._prepare(wrapper, site, sig, dim, device, sr, key in self._plain, buckets)
        try:
            self._self_check(wrapper, runtime, sr)
        except SiteError:
            raise
        except Exception as e:
            if key in self._plain:
                raise
            # A chosen μGraph failed when run (e.g. a kernel out of shared memory at launch):
            # this site, in every layer, runs its extracted program instead.
            self._plain[key] = f"chosen μGraph failed to run ({type(e).__name__}: {e}); running the program"
            sr.source, sr.kernels, sr.launches = "", 0, 0
            runtime = self._prepare(wrapper, site, sig, dim, device, sr, True, buckets)
            self._self_check(wrapper, runtime, sr)
        if key in self._plain:
            sr.source_note = self._plain[key]
        return runtime

    def _prepare(self, wrapper, site, sig, dim: int, device, sr: SiteReport, plain: bool, buckets: tuple[int, ...]):
        parts, kernels, launches = [], 0, 0
        seen: list[str] = []
        for name, part, outputs in site_parts(site.name, wrapper, self.stack):
            sr.kernels = sr.launches = 0
            twin = seen.count(name)  # > 0: an earlier part runs this program (v after k)
            seen.append(name)
            per_bucket: dict[int, BucketKernel] = {}
            splits = stacked_widths(wrapper, outputs)
            for m in sorted(buckets, reverse=True):  # search the largest bucket, re-instantiate the rest
                per_bucket[m] = replace(self._kernel(part, name, sig, dim, m, device, sr, plain, twin), splits=splits)
            parts.append((name, per_bucket, outputs))
            kernels, launches = kernels + sr.kernels, launches + sr.launches
        merged = self._merge_twins(parts, device, sr) if self.options.paired_launch else [p[1:] for p in parts]
        residual_dim = _out_dim(wrapper.head) if wrapper.residual else None
        runtimes = [(SiteRuntime(dim, self.dtype, device, per_bucket, residual_dim), outputs)
                    for per_bucket, outputs in merged]
        sr.kernels, sr.launches, sr.parts = kernels, launches, len(runtimes)
        if len(runtimes) == 1:
            return runtimes[0][0]
        return PartsRuntime(runtimes)

    def _merge_twins(self, parts: list, device, sr: SiteReport) -> list:
        """``patching.pairing.merge_twins`` with one ``Pairing`` per device for the whole patch() call
        (its decisions, per program and bucket, serve every layer), noted in the site's report."""
        t0 = time.perf_counter()
        if device not in self._pairings:
            self._pairings[device] = Pairing(device, self.cache, short_dtype(self.dtype))
        pairing = self._pairings[device]
        compiled_before = pairing.compiles
        merged = merge_twins(parts, pairing.call)
        self.counts.compiles += pairing.compiles - compiled_before
        for name, a, b in twins(parts):
            for m in sorted(a):
                note = pairing.note(a[m], b[m])
                if note:
                    sr.profile[f"{name} paired b{m}"] = note
        _add_time(sr, "build", time.perf_counter() - t0)
        return merged

    def _kernel(self, wrapper, name: str, sig, dim: int, m: int, device, sr: SiteReport, plain: bool,
                twin: int = 0) -> BucketKernel:
        """The site part's kernel at ``m`` rows. ``twin`` > 0: another part of the same site runs the
        same program (k and v); it gets an executor of its own, as an executor's outputs are
        buffers it reuses on every call, and both parts' outputs are alive at once."""
        t0 = time.perf_counter()
        ex = self._program(wrapper, name, sig, dim, m, device)
        _add_time(sr, "extract", time.perf_counter() - t0 + self._prefetch_seconds)
        self._prefetch_seconds = 0.0
        program = ex.graph
        dg = digest(program)
        sr.program = dg
        bkey = (dg, device, plain)
        built = self._built.get(bkey)
        if isinstance(built, SiteError):  # this program already failed for an earlier layer
            raise built
        if twin and built is not None:
            built = self._twin(built, bkey + (twin,), device)
        if built is None:  # first site with this program: its report carries the shared times
            try:
                built = self._build(program, dg, name, m, device, self._searched.get((name, sig)), plain)
            except SiteError as e:
                self._built[bkey] = e
                raise
            if built[0].result is not None:
                self._searched.setdefault((name, sig), built[0].result)
            self._built[bkey] = built
            _add_time(sr, "optimize", built[0].seconds)
            _add_time(sr, "verify", built[1].seconds)
            _add_time(sr, "build", built[2].seconds)
        choice, ver, executor = built
        if choice.profile:
            sr.profile[f"{name} b{m}"] = choice.profile
        if not sr.source:  # the largest bucket's (searched) μGraph speaks for the site
            sr.source, sr.source_note, sr.verdict = choice.source, choice.note, ver.verdict
        sr.kernels = max(sr.kernels, len(choice.graph.customized_nodes()))
        sr.block_sums = max(sr.block_sums, sum(any(reduced_axes(o, n.block.grid) for o in n.block.outputs)
                                               for n in choice.graph.customized_nodes()))
        # a kernel that runs its consumer (a chained launch, superopt.ir.chain) is one launch for two
        sr.launches = max(sr.launches, choice.graph.num_kernels - len(chained(choice.launch)))
        if not ver.ok:
            raise SiteError(f"verification failed: {ver.verdict}")
        by_name = dict(zip((v.name for v in program.inputs), ex.sources))
        feeds, acts = [], []
        for v in choice.graph.inputs:
            src = by_name.get(v.name)
            if src is None:
                raise SiteError(f"μGraph input %{v.name} is not an input of the program")
            if src[0] == "arg":
                acts.append(src[1])
            feeds.append(None if src[0] == "arg" else
                         (wrapper.get_parameter(src[1]) if src[0] == "parameter" else wrapper.get_buffer(src[1])))
        return BucketKernel(executor, tuple(feeds), m, acts=tuple(acts))

    def _program(self, wrapper, name: str, sig, dim: int, m: int, device) -> Extracted:
        """The site part's program at ``m`` rows, extracted once per (part, signature, rows)."""
        key = (name, sig, m)
        ex = self._extracted.get(key) or self._at_rows(name, sig, m)
        if ex is None:
            ex = self._trace(wrapper, name, dim, m, device)
        if key not in self._extracted:
            for o in ex.graph.output_types:
                if len(o.shape) != 2 or o.shape[0] != m:
                    raise SiteError(f"extracted output {list(o.shape)} is not row-wise [{m}, N]")
            self._extracted[key] = ex
        return ex

    def prefetch(self, layer: torch.nn.Module, site: NormSite | ProjSite) -> None:
        """Start verifying, in the background, every cache entry this site will hit that this user
        did not sign (shipped, imported): ``optimize.prefetch``. patch() calls it for every site
        before preparing any, so the verifications of all programs share the CPU cores and overlap
        the extraction and the builds, instead of running one program after another; ``prepare``
        then waits for each result where it used to verify. Only a hint: anything that fails here
        fails again, and is reported, in ``prepare``."""
        if self.cache is None:
            return
        t0 = time.perf_counter()
        try:
            self._prefetch(layer, site)
        except Exception:   # a hint only: prepare() meets the same failure and reports it
            pass
        self._prefetch_seconds += time.perf_counter() - t0

    def _prefetch(self, layer: torch.nn.Module, site: NormSite | ProjSite) -> None:
        wrapper = site_module(layer, site)
        sig = signature(wrapper)
        if (site.name, sig) in self._prefetched or unsupported_layers(wrapper):
            return
        self._prefetched.add((site.name, sig))
        device = next(wrapper.parameters()).device
        pdl, target = self._compile_target(device)
        for _, program, key, entry in self._entries(wrapper, site, sig):
            if entry is not None and not entry.signed:
                optimize.prefetch(program, entry, key, pdl, target, backends.gpu_name(device),
                                  self.options.deterministic)

    def cached_buckets(self, layer: torch.nn.Module, site: NormSite | ProjSite) -> tuple[int, ...]:
        """The call's buckets at which the cache (the user's or the shipped one) holds an entry for every part of
        ``site``: where it can run without a search (``PatchOptions.lm_head == "cached"``). An entry that then
        fails its verification is searched again, as any rejected entry is (``optimize.choose``)."""
        wrapper = site_module(layer, site)
        if self.cache is None or unsupported_layers(wrapper):
            return ()
        missing = {m for m, _, _, entry in self._entries(wrapper, site, signature(wrapper)) if entry is None}
        return tuple(m for m in sorted(self.buckets) if m not in missing)

    def _entries(self, wrapper, site: NormSite | ProjSite, sig):
        """(bucket, program, cache key, cache entry or None) of every part of the site at every bucket of the call,
        the largest bucket first."""
        dim, device = _dim(wrapper.head), next(wrapper.parameters()).device
        for name, part, _ in site_parts(site.name, wrapper, self.stack):
            for m in sorted(self.buckets, reverse=True):
                program = self._program(part, name, sig, dim, m, device).graph
                key = self._cache_key(digest(program), name, m, device)
                yield m, program, key, self.cache.get(key, count=False)

    def _compile_target(self, device) -> tuple[bool, object]:
        """(dependent launch as the build resolves it, the GPU's Triton target) for compiling a
        cache entry's kernels while it is verified; no target where nothing is compiled for a GPU."""
        if self.backend != "triton" or torch.device(device).type != "cuda":
            return False, None
        from triton.runtime import driver
        from superopt.runtime.grid_dependency import applies

        with torch.cuda.device(device):
            return applies(device, self.options.pdl), driver.active.get_current_target()

    def _cache_key(self, dg: str, site_name: str, m: int, device):
        from ..cache import CacheKey, versions_now
        arch = backends.arch_of(device)
        return CacheKey(dg, f"b{m}{self.shard_tag}", short_dtype(self.dtype), arch.replace("_", ""),
                        self.backend, versions_now(), f"{site_name}-m{m}{self.shard_tag}")

    def _trace(self, wrapper, name: str, dim: int, m: int, device) -> Extracted:
        """The site's program at ``m`` rows: from the program memo of the cache (a warm patch
        traces nothing), else by ``torch.export`` of the site's modules, then remembered."""
        from ..cache.programs import ProgramMemo, fingerprint

        memo = ProgramMemo(self.cache)
        fp = fingerprint(wrapper, name, m, self.dtype)
        ex = memo.get(fp)
        if ex is None:
            try:
                ex = extract(wrapper, self._example(wrapper, m, device), f"{name}_m{m}")
            except ExtractError as e:
                raise SiteError(f"extraction failed: {e}") from None
            memo.put(fp, ex)
        return ex

    def _example(self, wrapper, m: int, device) -> tuple[torch.Tensor, ...]:
        """Random activations for the site at ``m`` rows: ``x`` (and the residual, if it takes one)."""
        return tuple(torch.randn(m, d, generator=self._rng).to(device, self.dtype) for d in activation_dims(wrapper))

    def _at_rows(self, name: str, sig, m: int) -> Extracted | None:
        """The program ``name`` already extracted at another bucket, re-typed for ``m`` rows
        (``superopt.lax.rows``: tracing again costs ~0.1 s a program); None if it cannot be."""
        done = next((ex for (n, sg, _), ex in self._extracted.items() if n == name and sg == sig), None)
        if done is None:
            return None
        rows_inputs = [v.name for v, src in zip(done.graph.inputs, done.sources) if src[0] == "arg"]
        try:
            return Extracted(with_rows(done.graph, rows_inputs, m, f"{name}_m{m}"), done.sources)
        except RowsError:
            return None

    def _twin(self, built: tuple, key: tuple, device) -> tuple:
        """A second executor of a built program (the same source and binaries: nothing compiles)."""
        if key not in self._built:
            choice, ver, executor = built
            twin = self._backend_build(choice.graph, self.backend, device, choice.launch, executor.binaries)
            self._built[key] = (choice, ver, twin)
        return self._built[key]

    def _build(self, program, dg: str, site_name: str, m: int, device, seed, plain: bool) -> tuple:
        arch = backends.arch_of(device)
        if plain:
            try:
                executor = self._backend_build(program, self.backend, device)
            except Exception as e:
                raise SiteError(f"build failed ({self.backend}): {type(e).__name__}: {e}") from None
            self.counts.programs += 1
            self.counts.compiles += executor.compiled
            return (optimize.Choice(program, "fallback", "", 0.0), optimize.verify(program, program), executor)
        key = self._cache_key(dg, site_name, m, device) if self.cache is not None else None
        # On CPU the search still targets sm_90: the torch backend runs any μGraph, and searching
        # for the GPU's structures is what exercises the whole path without a GPU.
        search_arch = arch if device.type == "cuda" else "sm_90"
        profiled = self.backend == "triton" and device.type == "cuda"
        budget, fitted = self.budget, cost_fit.params(self.cache, search_arch) if profiled else None
        if fitted is not None:  # the cost model's constants fitted to this arch's earlier profiles
            from superopt.search import SearchBudget
            budget = replace(budget or SearchBudget(), cost_params=fitted)
        choice = optimize.choose(program, budget=budget, arch=search_arch, cache=self.cache, key=key,
                                 seed=seed, pick=self._pick(program, device) if profiled else None,
                                 research=self.options.research, gpu=backends.gpu_name(device),
                                 retime=self.options.retime_launches)
        ver = optimize.verification_of(program, choice, self.cache, key)
        self.counts.searches += choice.source == "search"
        self.counts.reinstantiated += choice.source == "reinstantiated"
        self.counts.cache_hits += choice.source == "cache"
        self.counts.programs += 1
        from ..cache.builds import build_of, store_build
        # a warm entry compiles nothing: its build comes with the hit (read and hash-checked once)
        stored = build_of(choice.entry, key) if choice.entry is not None else None
        try:
            executor = self._backend_build(choice.graph, self.backend, device, choice.launch,
                                           stored.binaries if stored else None)
        except Exception as e:
            if choice.graph == program:  # nothing simpler to fall back to: the site stays original
                raise SiteError(f"build failed ({self.backend}): {type(e).__name__}: {e}") from None
            # The searched μGraph did not compile: run the program itself (library kernels).
            why = f"{choice.source} μGraph did not build ({type(e).__name__}: {e}); running the program"
            choice = optimize.Choice(program, "fallback", why, choice.seconds)
            ver = optimize.verify(program, program)
            try:
                executor = self._backend_build(program, self.backend, device)
            except Exception as e2:
                raise SiteError(f"build failed ({self.backend}): {type(e2).__name__}: {e2}") from None
        self.counts.compiles += executor.compiled
        # the entry's μGraph built: its binaries join the entry, unless they came from it (a warm hit:
        # store_build would only read the entry again, cubins and hashes, to find it already built)
        if choice.source != "fallback" and not (stored and stored.binaries):
            store_build(self.cache, key, executor.binaries)
        return choice, ver, executor

    def _unchecked_buckets(self, runtime) -> list[int]:
        """The buckets whose kernels no earlier site's self-check ran, or the smallest bucket alone
        where an earlier site (another layer) checked them all: each design's arithmetic is then
        known good, and one bucket shows that this layer's weights are the ones bound."""
        parts = [p for p, _ in runtime.parts] if isinstance(runtime, PartsRuntime) else [runtime]
        fresh = []
        for m in runtime.kernels:
            executors = tuple(p.kernels[m].executor for p in parts)
            key = (m, tuple(map(id, executors)))
            if key not in self._checked:
                self._checked[key] = executors   # held, so an id is never reused while it is a key
                fresh.append(m)
        return fresh or [min(runtime.kernels)]

    def _self_check(self, wrapper, runtime: SiteRuntime, sr: SiteReport) -> None:
        """The kernel against the original modules in float64, on random inputs: at every bucket
        where its kernels are new to this patch, else at the smallest (``_unchecked_buckets``)."""
        t0 = time.perf_counter()
        ref_mod = copy.deepcopy(wrapper).to(torch.float64)
        tol = tolerance(self.dtype, self.backend != "torch")
        if tol is None:
            raise SiteError(f"no tolerance for dtype {self.dtype}")
        worst, like_input = 0.0, True
        for m in self._unchecked_buckets(runtime):
            acts = self._example(wrapper, m, "cpu")
            with torch.no_grad():
                got = runtime.run(*[a.to(runtime.device) for a in acts])
                want = ref_mod(*[a.to(runtime.device, torch.float64) for a in acts])
            for g, w in zip(got, want):
                err = ((g.double() - w).norm() / w.norm().clamp_min(1e-300)).item()
                worst = max(worst, err) if err == err else float("inf")
            like_input = like_input and got[0].shape == acts[0].shape and got[0].dtype == acts[0].dtype
        sr.check_error = worst
        if isinstance(runtime, PartsRuntime):
            runtime.norm_like_input = like_input and runtime.norm_part is not None
        _add_time(sr, "check", time.perf_counter() - t0)
        if not worst <= tol:
            raise SiteError(f"numeric self-check failed: error {worst:.2e} > {tol:.0e} ({self.dtype})")


def _add_time(sr: SiteReport, what: str, s: float) -> None:
    sr.times[what] = sr.times.get(what, 0.0) + s
