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

import json
import multiprocessing as mp
import time
import warnings
from dataclasses import dataclass, field, replace

from ..abstract import NotNormalizable, Unsupported, analyze
from ..ir import SMEM_BUDGET, KernelGraph, check, digest, layout, shared_memory_bytes, to_text
from .budget import SearchBudget, SearchStats
from .checkpoint import Checkpoint
from .cost import DEFAULT_PARAMS, SMS, cost_of, features, graph_cost, with_threads
from .instantiate import assemble, build_kernel, extent_choices, sparse_extents
from .kernel import enumerate_patterns, run_pattern
from .movement import LOWERED_OPS
from .skeleton import design_key, retarget, search_key
from .softmax import prepare
from .verify import verify_full, verify_reduced


CANDIDATES = 40  # graphs handed the profiler (``SearchResult.candidates``): ~3 builds each to time


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

    def candidates(self, designs: int = 3, limit: int = CANDIDATES) -> list[KernelGraph]:
        """What a profiler should time, duplicates (by ``layout``) dropped, ``best`` first:

        1. the ``designs`` best-ranked graphs, each followed by its ``ALTERNATIVES`` cost-best
           other extents (``_diverse``), a split design only on the best-ranked of its combine
           kernels' grids (the others repeat its first kernels);
        2. up to ``limit`` in all, the rest of the verified designs of the ``designs`` best-ranked
           families (``_family``; the unfused program is one) and the band of every design's
           alternatives, taken in turn from each family and, within one, from each design; a
           loop-less design after its looped sibling (whose loop of one iteration it is)."""
        tier1, families, mains, first = [], {}, set(), 0
        for i, (g, _) in enumerate(self.ranked):
            alts = self.alternatives[i] if i < len(self.alternatives) else []
            d = self.designs[i][0] if i < len(self.designs) else None
            if d is not None and len(d) > 1:  # a split combined on another grid: the same first kernels
                if design_key(d[:1]) in mains:
                    continue
                mains.add(design_key(d[:1]))
            in_tier1 = first < designs
            if in_tier1:
                tier1 += [g] + alts[:ALTERNATIVES]
                first += 1
            fam = _family(d) if d is not None else None
            if fam not in families and len(families) >= designs:
                continue
            rest = alts[ALTERNATIVES:] if in_tier1 else [g] + alts
            looped = d is not None and d[0].pattern.loop >= 0
            families.setdefault(fam, []).append((not looped, i, rest))
        tier2 = _in_turn([_in_turn([r for _, _, r in sorted(lists, key=lambda x: x[:2])])
                          for lists in families.values()])
        out, seen = [], set()
        for n, g in enumerate(tier1 + tier2):
            if (n < len(tier1) or len(out) < limit) and layout(g) not in seen:
                seen.add(layout(g))
                out.append(g)
        return out

    @property
    def best(self) -> KernelGraph:
        return self.ranked[0][0]

    def reinstantiate(self, program: KernelGraph) -> "SearchResult":
        """The same structures at another shape of the same program, re-verified, without a search."""
        t0 = time.perf_counter()
        search_program, finish = prepare(program)
        index = analyze(search_program)
        stats = SearchStats()
        # Re-verified at the reduced shape, as many designs as a search verifies (the cost model's
        # favourite at one shape is not the profiler's at another: at 8 rows it split the rows
        # across blocks, and a design reading each weight tile once was never timed); the float64
        # re-check at the new shape only where it is quick, so a shape bucket costs under a second.
        quick = replace(self.budget, full_verify_elements=min(self.budget.full_verify_elements, 1_000_000))
        try:
            found = _rank_and_verify(program, index, [d for d, _ in self.designs if d is not None], quick,
                                     self.arch, self.seed, stats, finish=finish)
        except OUT_OF_SPACE as e:  # a structure that does not fit this shape: the fallback, with why
            found = []
            stats.fallback_reasons.append(f"reinstantiate: {type(e).__name__}: {e}")
        stats.seconds["reinstantiate"] = time.perf_counter() - t0
        ranked, kept, alts = _with_fallback(program, found, self.arch, self.budget.cost_params)
        return SearchResult(program, self.budget, self.arch, self.seed, ranked, stats, kept, alts)


# What leaves the search space: the abstract domain's own signals, and the shape / key / arity
# errors a half-modelled op raises deep inside a block search. Anything else is a bug and raises.
OUT_OF_SPACE = (Unsupported, NotNormalizable, ValueError, KeyError, IndexError, NotImplementedError)


def _job(args):
    program, index, pattern, budget, cap, deadline, whole_exp = args
    if time.time() > deadline:
        return pattern, None, None
    try:
        designs, st = run_pattern(program, index, pattern, budget, cap, deadline, whole_exp)
    except OUT_OF_SPACE as e:
        return pattern, None, f"pattern {pattern.key()}: {type(e).__name__}: {e}"
    return pattern, designs, st


def superoptimize(program: KernelGraph, budget: SearchBudget = SearchBudget(), arch: str = "sm_90",
                  seed: int = 0, checkpoint=None) -> SearchResult:
    t_start = time.perf_counter()
    deadline = time.time() + budget.max_seconds
    stats = SearchStats()
    check(program, arch)
    if any(n.op in LOWERED_OPS for n in program.nodes):  # slices, head repeats, gathers, cache writes
        from .movement_search import superoptimize_lowered
        lowered = superoptimize_lowered(program, budget, arch, seed, checkpoint, superoptimize)
        if lowered is not None:
            return lowered
    designs: list = []
    # A max-subtracted softmax is searched with its max cancelled; every candidate then gets the
    # max back (online softmax) before it is ranked and verified against ``program`` (search/softmax.py).
    search_program, finish = prepare(program)
    try:
        t0 = time.perf_counter()
        index = analyze(search_program)
        stats.seconds["analyze"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        patterns = enumerate_patterns(search_program, index, budget)
        stats.patterns = len(patterns)
        stats.seconds["patterns"] = time.perf_counter() - t0
    except OUT_OF_SPACE as e:
        stats.verify_notes.append(f"no search: {e}")
        stats.fallback_reasons.append(f"analyze: {type(e).__name__}: {e}")
        index, patterns = None, []
    ckpt = Checkpoint(checkpoint, digest(program), _budget_key(budget), seed)
    if patterns:
        t0 = time.perf_counter()
        designs = _search(search_program, index, patterns, budget, deadline, ckpt, stats, finish is not None)
        stats.seconds["search"] = time.perf_counter() - t0
    found = []
    if designs:
        try:
            found = _rank_and_verify(program, index, designs, budget, arch, seed, stats, finish=finish)
        except OUT_OF_SPACE as e:
            stats.fallback_reasons.append(f"rank/verify: {type(e).__name__}: {e}")
    if not found and not stats.fallback_reasons:
        stats.fallback_reasons.append("no verified fused design: the unfused program is the result")
    for g, cost, _, _ in found:
        ckpt.record_found(to_text(g), cost)
    ranked, kept, alts = _with_fallback(program, found, arch, budget.cost_params)
    stats.seconds["total"] = time.perf_counter() - t_start
    return SearchResult(program, budget, arch, seed, ranked, stats, kept, alts)


def _with_fallback(program: KernelGraph, found: list, arch: str, params=None) -> tuple[list, list]:
    """The verified graphs plus the unfused program itself, by cost: ``best`` is never None."""
    ranked = [(g, c) for g, c, _, _ in found]
    kept = [x for _, _, x, _ in found]
    alts = [a for _, _, _, a in found]
    fallback = (program, graph_cost(program, arch, params))
    pos = next((i for i, (_, c) in enumerate(ranked) if c > fallback[1]), len(ranked))
    ranked.insert(pos, fallback)
    kept.insert(pos, (None, None))
    alts.insert(pos, [])
    return ranked, kept, alts


ALTERNATIVES = 5  # extents of a design kept besides its cost-best, by cost, for the profiler
WIDE_COUNTS = 4  # then block counts of the few-waves band, at two loop lengths each (``_diverse``)


def _kernel_options(k, types, index, budget, arch, stats) -> list:
    """[(node, cost, extents, on the sparse lattice)] of kernel skeleton ``k`` at every valid
    extent, cheapest first (the last for ``_diverse``: ``instantiate.sparse_extents``)."""
    params = budget.cost_params or DEFAULT_PARAMS
    sparse = sparse_extents(k, index, budget.tile_sizes, budget.loop_tile_sizes)
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
        f0 = features(node, args, arch)
        for t in budget.block_threads:
            cand = replace(node, block=replace(node.block, block_threads=t))
            stats.instances += 1
            f = with_threads(f0, t)
            c = cost_of(f, params)
            if best is None or c < best[1]:
                best = (cand, c, (e[0], e[1], t), (e[0], e[1]) in sparse)
        opts.append(best)
    return sorted(opts, key=lambda o: o[1])


def _diverse(opts: list, sms: int = 132, split: bool = False) -> list:
    """On the sparse lattice (``instantiate.sparse_extents``), the cheapest option and the
    cheapest of each other (block count, loop length) shape, ``ALTERNATIVES`` of them besides the
    first — the earlier rule, kept on the earlier lattice: on the dense one the cost model is flat
    and its cheapest shapes crowd a narrow range (all 128-512 blocks for Llama-3-8B down+res at
    one row, won by 4096 blocks); then, on the dense lattice, the *band*: for the ``WIDE_COUNTS`` cheapest
    block counts between a quarter of a wave and four waves of ``sms`` SMs, the cheapest loop
    length of each and the loop of half as many iterations (slices twice as long: the tile-size
    term caps a tile at ``TILE_ELEMS``, and the 8-row winners sit one step above it; where the
    cheapest is one iteration, the cheapest loop), those not kept already.

    The band is kept whatever the cost model says: at 8 rows a decode GEMV is fastest with wide
    tiles (32-64 columns a block, K slices of 256-512, 64-224 blocks: the hand-written designs'
    tilings, ``benchmarks/fixture_gap.py``), where the model's wave and tile-size terms rank them far
    down (two [64, 256] weight tiles a block are charged twice the time of [64, 128] ones, and won
    on the H100); only the GPU profiler tells those apart."""
    out, seen = [], set()

    def keep(o, by_grid: bool = False) -> None:
        b = o[0].block
        shape = (b.grid if by_grid else b.num_blocks, b.forloop)
        if shape not in seen:
            seen.update({shape, (b.num_blocks, b.forloop), (b.grid, b.forloop)})
            out.append(o)
    for o in [o for o in opts if o[3]] or opts:
        if len(out) > ALTERNATIVES:
            break
        keep(o)
    by_count: dict[int, list] = {}
    for o in opts:
        if sms / 4 <= o[0].block.num_blocks <= 4 * sms:
            by_count.setdefault(o[0].block.num_blocks, []).append(o)
    for group in list(by_count.values())[:WIDE_COUNTS]:
        f0, g0 = group[0][0].block.forloop, group[0][0].block.grid
        # the second of a count: for a ``split`` kernel (the first of a split design) the cheapest
        # on another grid where there is one (its blocks are heads × KV splits: 256 blocks of one
        # kv head and 32 splits, the hand-written decode attention at 32k, one row, is another
        # design than 2 heads × 64 splits at the same loop, and the cost model puts them within a
        # few %); else half the loop (one-kernel designs: the 8-row GEMV winners were those)
        other = [o for o in group if o[0].block.grid != g0] if split else []
        second = (other or [o for o in group if 2 * o[0].block.forloop == f0] or
                  [o for o in group if o[0].block.forloop != f0])
        for o in [group[0]] + second[:1]:
            keep(o, by_grid=True)
    return out


def _family(design) -> tuple:
    """The number of kernels and the first kernel's grid indices. Designs of one family differ in
    what their for-loops walk, or in the grid of a combine kernel (a split kernel's partial sums
    are combined on any grid over the outputs), and often tie: a loop of one iteration is no
    loop, so the loop-less design's cost is its looped sibling's at for-loop 1. Counting designs,
    the loop-less one took the sibling's place among those verified and offered, and the
    sibling's longer loops with it (Qwen2.5-0.5B qkv at 8 rows: 16 columns a block, K in 7 slices,
    ``benchmarks/fixture_gap.py``); three combine grids of one split took all three places."""
    return len(design), design[0].pattern.grid


def _in_turn(lists: list[list]) -> list:
    """The items of ``lists`` taken one from each in turn: [[a, b], [c]] -> [a, c, b]."""
    return [x[t] for t in range(max(map(len, lists), default=0)) for x in lists if t < len(x)]


def _budget_key(budget: SearchBudget) -> dict:
    """The budget fields that change what a pattern search finds (not its clock or its workers)."""
    log = budget.log()
    for k in ("max_seconds", "workers", "verify_top", "full_verify_elements", "cost_params"):
        log.pop(k)
    return log


# A forked worker can hang for good on a lock another thread of the parent held at the fork (CUDA's, a pool's
# manager). Every block search returns soon after the deadline (it checks the clock every 1024 states), so the
# parent waits this much longer for each, then goes on with what came back.
STALL_GRACE_S = 60.0


def _patience(deadline: float) -> float | None:
    """Seconds to wait for the next block search from the pool (None: no deadline, wait as long as it takes)."""
    return None if deadline == float("inf") else max(0.0, deadline - time.time()) + STALL_GRACE_S


def _search(program, index, patterns, budget, deadline, ckpt, stats, whole_exp=False) -> list:
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
            todo.append((program, index, p, budget, cap, deadline, whole_exp))
    if budget.workers > 1 and len(todo) > 1:
        with mp.get_context("fork").Pool(budget.workers) as pool:  # its exit kills the workers, a stuck one too
            outs = pool.imap(_job, todo)
            for done in range(len(todo)):
                try:
                    out = outs.next(timeout=_patience(deadline))
                except mp.TimeoutError:
                    why = (f"{len(todo) - done} of {len(todo)} block searches not back {STALL_GRACE_S:.0f} s after "
                           "the search's deadline (a stuck worker): skipped")
                    warnings.warn(f"superopt search: {why}", RuntimeWarning, stacklevel=2)
                    stats.time_budget_hit = True
                    stats.fallback_reasons.append(why)
                    break
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


def _rank_and_verify(program, index, designs, budget, arch, seed, stats, top=None, finish=None) -> list:
    """[(graph, cost, (design, extents), alternatives)] verified, best first; one entry per design.

    ``alternatives``: the same design at other extents (at most ``ALTERNATIVES``, each a different
    block count or loop length of the main kernel), cheapest first. The cost model cannot see
    per-block latency or what the code generator makes of a tile, so these are what the GPU
    profiler times against the winner; they are the verified design, only instantiated otherwise.
    ``finish`` (``softmax.stabilize``) rewrites each built graph; its cost is then re-estimated.
    """
    t0 = time.perf_counter()
    best_per_design = []
    memo: dict = {}  # a split kernel recurs in every design that retargets its combine kernel
    for d in designs:
        # Kernel costs add up and a kernel's input shapes do not depend on another kernel's
        # extents, so each kernel's extents (and then its thread count) are chosen on their own.
        types = {v.name: v.type for v in program.inputs}
        options = []
        for k in d:
            key = (json.dumps(k.to_json(), sort_keys=True), tuple(types.get(s) for s in k.sources))
            if key not in memo:
                memo[key] = _kernel_options(k, types, index, budget, arch, stats)
            opts = memo[key]
            if not opts:
                break
            build_kernel(k, types, index, opts[0][2])  # record its output types for the next kernel
            options.append(opts)
        else:
            graphs, dropped = [], None
            for main in _diverse(options[0], SMS.get(arch, 132), split=len(d) > 1):
                nodes = [main[0]] + [o[0][0] for o in options[1:]]
                cost = main[1] + sum(o[0][1] for o in options[1:])
                try:
                    g = assemble(program, nodes)
                    if finish is not None:
                        g = finish(g)
                        cost = graph_cost(g, arch)
                    graphs.append((check(g, arch), cost, (main[2],) + tuple(o[0][2] for o in options[1:])))
                except ValueError as e:
                    dropped = dropped or e
                    continue
            if not graphs and dropped is not None:
                stats.verify_notes.append(f"design of {len(d)} kernel(s) dropped: {dropped}")
            if graphs:
                g, cost, exts = graphs[0]
                best_per_design.append((g, cost, (d, exts), [x[0] for x in graphs[1:]]))
    best_per_design.sort(key=lambda x: x[1])
    stats.seconds["rank"] = stats.seconds.get("rank", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    # The cost-best few, plus the best of the designs with the fewest kernels (the most fused form
    # is always verified and ranked, even when the cost model prefers a split).
    if top is None:  # every design of the verify_top best families (``_family``)
        families = list(dict.fromkeys(_family(x[2][0]) for x in best_per_design))[: budget.verify_top]
        chosen = [x for x in best_per_design if _family(x[2][0]) in families]
    else:
        chosen = best_per_design[:top]
    if best_per_design and top is None:
        fewest = min(best_per_design, key=lambda x: (len(x[2][0]), x[1]))
        if all(fewest is not c for c in chosen):
            chosen.append(fewest)
    out = []
    for g, c, (d, ext), alts in chosen:
        ok, note = verify_reduced(program, index, d, seed, arch, finish, budget.keep_precision)
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


