"""``superoptimize``: the search pipeline, its result, and structure reuse at other shapes.

Stages, in order (wall time of each in ``stats.seconds``):

1. ``analyze``    index analysis and abstract targets of the Lax program (``superopt.abstract``);
2. ``patterns``   tiling patterns derived from the shapes (``kernel.enumerate_patterns``);
3. ``search``     one block search per pattern, in worker processes, checkpointed as each ends;
4. ``rank``       every found design at every candidate extent, ranked by the cost model;
5. ``verify``     the best distinct designs re-built at a reduced shape and checked by
                  ``superopt.verify.check_equivalent``; the winner re-checked at the real shape in
                  float64 when its inputs are small enough (``budget.full_verify_elements``).

The unfused program is always in the ranking, so ``result.best`` is never None. A valid program
that leaves the search space anywhere (an op the abstract domain does not model, a value it cannot
normalise, a pattern whose search fails) is never an exception: that stage or pattern is dropped,
its reason goes to ``stats.fallback_reasons``, and the unfused program is the result.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field, replace

from ..abstract import NotNormalizable, Unsupported, analyze
from ..ir import SMEM_BUDGET, KernelGraph, check, digest, shared_memory_bytes, to_text
from .budget import SearchBudget, SearchStats
from .checkpoint import Checkpoint
from .cost import graph_cost, node_cost
from .instantiate import assemble, build_kernel, extent_choices
from .kernel import enumerate_patterns, run_pattern
from .skeleton import design_key, retarget, search_key
from .verify import verify_full, verify_reduced


@dataclass
class SearchResult:
    program: KernelGraph
    budget: SearchBudget
    arch: str
    seed: int
    ranked: list                      # (KernelGraph, cost µs), best first, all verified
    stats: SearchStats
    designs: list = field(default_factory=list)  # (design, extents) parallel to ranked; None for the fallback
    alternatives: list = field(default_factory=list)  # [KernelGraph] parallel to ranked: other extents

    def candidates(self, designs: int = 3) -> list[KernelGraph]:
        """What a profiler should time: the ``designs`` best-ranked graphs, each followed by its
        design at other extents (all verified designs; the unfused program is one of the ranked)."""
        out = []
        for i, (g, _) in enumerate(self.ranked[:designs]):
            out.append(g)
            out += self.alternatives[i] if i < len(self.alternatives) else []
        return out

    @property
    def best(self) -> KernelGraph:
        return self.ranked[0][0]

    def reinstantiate(self, program: KernelGraph) -> "SearchResult":
        """The same structures at another shape of the same program, re-verified, without a search."""
        t0 = time.perf_counter()
        index = analyze(program)
        stats = SearchStats()
        # Re-verified at the reduced shape, as many designs as a search verifies (the cost model's
        # favourite at one shape is not the profiler's at another: at 8 rows it split the rows
        # across blocks, and a design reading each weight tile once was never timed); the float64
        # re-check at the new shape only where it is quick, so a shape bucket costs under a second.
        quick = replace(self.budget, full_verify_elements=min(self.budget.full_verify_elements, 1_000_000))
        try:
            found = _rank_and_verify(program, index, [d for d, _ in self.designs if d is not None], quick,
                                     self.arch, self.seed, stats)
        except OUT_OF_SPACE as e:  # a structure that does not fit this shape: the fallback, with why
            found = []
            stats.fallback_reasons.append(f"reinstantiate: {type(e).__name__}: {e}")
        stats.seconds["reinstantiate"] = time.perf_counter() - t0
        ranked, kept, alts = _with_fallback(program, found, self.arch)
        return SearchResult(program, self.budget, self.arch, self.seed, ranked, stats, kept, alts)


# What leaves the search space: the abstract domain's own signals, and the shape / key / arity
# errors a half-modelled op raises deep inside a block search. Anything else is a bug and raises.
OUT_OF_SPACE = (Unsupported, NotNormalizable, ValueError, KeyError, IndexError, NotImplementedError)


def _job(args):
    program, index, pattern, budget, cap, deadline = args
    if time.time() > deadline:
        return pattern, None, None
    try:
        designs, st = run_pattern(program, index, pattern, budget, cap, deadline)
    except OUT_OF_SPACE as e:
        return pattern, None, f"pattern {pattern.key()}: {type(e).__name__}: {e}"
    return pattern, designs, st


def superoptimize(program: KernelGraph, budget: SearchBudget = SearchBudget(), arch: str = "sm_90",
                  seed: int = 0, checkpoint=None) -> SearchResult:
    t_start = time.perf_counter()
    deadline = time.time() + budget.max_seconds
    stats = SearchStats()
    check(program, arch)
    designs: list = []
    try:
        t0 = time.perf_counter()
        index = analyze(program)
        stats.seconds["analyze"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        patterns = enumerate_patterns(program, index, budget)
        stats.patterns = len(patterns)
        stats.seconds["patterns"] = time.perf_counter() - t0
    except OUT_OF_SPACE as e:
        stats.verify_notes.append(f"no search: {e}")
        stats.fallback_reasons.append(f"analyze: {type(e).__name__}: {e}")
        index, patterns = None, []
    ckpt = Checkpoint(checkpoint, digest(program), _budget_key(budget), seed)
    if patterns:
        t0 = time.perf_counter()
        designs = _search(program, index, patterns, budget, deadline, ckpt, stats)
        stats.seconds["search"] = time.perf_counter() - t0
    found = []
    if designs:
        try:
            found = _rank_and_verify(program, index, designs, budget, arch, seed, stats)
        except OUT_OF_SPACE as e:
            stats.fallback_reasons.append(f"rank/verify: {type(e).__name__}: {e}")
    if not found and not stats.fallback_reasons:
        stats.fallback_reasons.append("no verified fused design: the unfused program is the result")
    for g, cost, _, _ in found:
        ckpt.record_found(to_text(g), cost)
    ranked, kept, alts = _with_fallback(program, found, arch)
    stats.seconds["total"] = time.perf_counter() - t_start
    return SearchResult(program, budget, arch, seed, ranked, stats, kept, alts)


def _with_fallback(program: KernelGraph, found: list, arch: str) -> tuple[list, list]:
    """The verified graphs plus the unfused program itself, by cost: ``best`` is never None."""
    ranked = [(g, c) for g, c, _, _ in found]
    kept = [x for _, _, x, _ in found]
    alts = [a for _, _, _, a in found]
    fallback = (program, graph_cost(program, arch))
    pos = next((i for i, (_, c) in enumerate(ranked) if c > fallback[1]), len(ranked))
    ranked.insert(pos, fallback)
    kept.insert(pos, (None, None))
    alts.insert(pos, [])
    return ranked, kept, alts


ALTERNATIVES = 5  # extents of a design kept besides its cost-best, for the profiler


def _kernel_options(k, types, index, budget, arch, stats) -> list:
    """[(node, cost, extents)] of kernel skeleton ``k`` at every valid extent, cheapest first."""
    opts = []
    for e in extent_choices(k, index, budget.tile_sizes, budget.block_threads, budget.loop_tile_sizes):
        try:
            node = build_kernel(k, dict(types), index, e)
        except (ValueError, KeyError):
            continue
        if shared_memory_bytes(node.block) > SMEM_BUDGET[arch]:
            continue
        args = [types[a] for a in node.args]
        best = None
        for t in budget.block_threads:
            cand = replace(node, block=replace(node.block, block_threads=t))
            stats.instances += 1
            c = node_cost(cand, args, arch)
            if best is None or c < best[1]:
                best = (cand, c, (e[0], e[1], t))
        opts.append(best)
    return sorted(opts, key=lambda o: o[1])


def _diverse(opts: list) -> list:
    """The cheapest option, then the cheapest of each other (block count, loop length) shape."""
    out, seen = [], set()
    for o in opts:
        shape = (o[0].block.num_blocks, o[0].block.forloop)
        if shape not in seen:
            seen.add(shape)
            out.append(o)
        if len(out) > ALTERNATIVES:
            break
    return out


def _budget_key(budget: SearchBudget) -> dict:
    """The budget fields that change what a pattern search finds (not its clock or its workers)."""
    log = budget.log()
    for k in ("max_seconds", "workers", "verify_top", "full_verify_elements"):
        log.pop(k)
    return log


def _search(program, index, patterns, budget, deadline, ckpt, stats) -> list:
    """One block search per search key (``skeleton.search_key``), retargeted to every pattern."""
    keys = list(dict.fromkeys(search_key(p) for p in patterns))
    stats.searches = len(keys)
    cap = max(1000, budget.max_states // len(keys))
    results: dict = {}
    todo = []
    for p in keys:
        if p.key() in ckpt.patterns:
            results[p.key()] = ckpt.patterns[p.key()]
            stats.patterns_resumed += 1
        else:
            todo.append((program, index, p, budget, cap, deadline))
    if budget.workers > 1 and len(todo) > 1:
        with mp.get_context("fork").Pool(budget.workers) as pool:
            for out in pool.imap(_job, todo):
                _take(out, results, ckpt, stats)
    else:
        for job in todo:
            _take(_job(job), results, ckpt, stats)
    for p in keys:  # key order, not completion order: deterministic
        if p.key() in results:
            _add_stats(stats, results[p.key()][1])
    labels = {v.name: index.labels[v.name] for v in program.inputs}
    designs, seen = [], set()
    for p in patterns:
        got = results.get(search_key(p).key())
        if got is None:
            continue
        stats.patterns_found += bool(got[0])
        for d in got[0]:
            d = (retarget(d[0], p, labels),) + tuple(d[1:])
            k = design_key(d)
            if k not in seen:
                seen.add(k)
                designs.append(d)
    return designs


def _take(out, results, ckpt, stats) -> None:
    pattern, designs, st = out
    if designs is None and isinstance(st, str):  # the pattern left the search space
        stats.fallback_reasons.append(st)
        return
    if designs is None:
        stats.patterns_skipped_time += 1
        stats.time_budget_hit = True
        return
    stats.patterns_searched += 1
    results[pattern.key()] = (designs, st)
    ckpt.record_pattern(pattern.key(), designs, st)


def _add_stats(stats: SearchStats, st: dict) -> None:
    stats.states += st["states"]
    stats.values_kept += st["values"]
    stats.add_pruned(st["pruned"])
    stats.oracle_queries += st["oracle_queries"]
    stats.oracle_hits += st["oracle_hits"]
    stats.oracle_seconds += st["oracle_seconds"]
    stats.state_budget_hit += st["cap_hit"]


def _rank_and_verify(program, index, designs, budget, arch, seed, stats, top=None) -> list:
    """[(graph, cost, (design, extents), alternatives)] verified, best first; one entry per design.

    ``alternatives``: the same design at other extents (at most ``ALTERNATIVES``, each a different
    block count or loop length of the main kernel), cheapest first. The cost model cannot see
    per-block latency or what the code generator makes of a tile, so these are what the GPU
    profiler times against the winner; they are the verified design, only instantiated otherwise.
    """
    t0 = time.perf_counter()
    best_per_design = []
    for d in designs:
        # Kernel costs add up and a kernel's input shapes do not depend on another kernel's
        # extents, so each kernel's extents (and then its thread count) are chosen on their own.
        types = {v.name: v.type for v in program.inputs}
        options = []
        for k in d:
            opts = _kernel_options(k, types, index, budget, arch, stats)
            if not opts:
                break
            build_kernel(k, types, index, opts[0][2])  # record its output types for the next kernel
            options.append(opts)
        else:
            graphs = []
            for main in _diverse(options[0]):
                nodes = [main[0]] + [o[0][0] for o in options[1:]]
                try:
                    graphs.append((check(assemble(program, nodes), arch), main[1] + sum(o[0][1] for o in options[1:]),
                                   (main[2],) + tuple(o[0][2] for o in options[1:])))
                except ValueError:
                    continue
            if graphs:
                g, cost, exts = graphs[0]
                best_per_design.append((g, cost, (d, exts), [x[0] for x in graphs[1:]]))
    best_per_design.sort(key=lambda x: x[1])
    stats.seconds["rank"] = stats.seconds.get("rank", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    # The cost-best few, plus the best of the designs with the fewest kernels (the most fused form
    # is always verified and ranked, even when the cost model prefers a split).
    chosen = best_per_design[: top or budget.verify_top]
    if best_per_design and top is None:
        fewest = min(best_per_design, key=lambda x: (len(x[2][0]), x[1]))
        if all(fewest is not c for c in chosen):
            chosen.append(fewest)
    out = []
    for g, c, (d, ext), alts in chosen:
        ok, note = verify_reduced(program, index, d, seed, arch, budget.keep_precision)
        if ok and not out:
            ok2, note2 = verify_full(program, g, seed, budget.full_verify_elements)
            note += "; " + note2
            ok = ok and ok2
        stats.verify_notes.append(f"{g.num_kernels} kernel(s), {c:.1f} us: {note}")
        if ok:
            stats.verified += 1
            out.append((g, c, (d, ext), alts))
        else:
            stats.rejected += 1
    stats.seconds["verify"] = stats.seconds.get("verify", 0.0) + time.perf_counter() - t0
    return out


