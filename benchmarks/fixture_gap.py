"""Why a hand-written fixture beat the search on a block-benchmark row: is its design in the search's space?

    PYTHONPATH=$PWD python benchmarks/fixture_gap.py benchmarks/results/blocks_h100_2026-11-25_s17.md [--only b8,LoRA]
        [--cost-params cost_fit.json]

For every row of a ``bench_blocks.py`` table won by a hand-written fixture (the tiling column reads
``fixture: grid 1x128x1 f16 w4s3``, or the "hand-written" column beats the "searched" one), on a CPU:

1. the winner's kernel shape: the fixture re-tiled to the winning grid and for-loop
   (``superopt.runtime.retile``) — blocks, for-loop iterations, input tiles per iteration, threads;
2. the search's whole space for the row's program, as ``superoptimize`` builds it: every design its
   block searches found, at every extent ``extent_choices`` offers (``driver._kernel_options``);
3. whether a design with the winner's *shape* — the same block count, for-loop length and multiset
   of input tiles (grid axes may be permuted: x or y makes no difference to the blocks) — is in that
   space; its cost-model rank among all instances and its estimate against the cost model's pick;
4. whether it reached the profiler: ``SearchResult.candidates()``, what ``bench_blocks`` and
   ``patch()`` time. If not, why: not enumerated (grid / loop extents, tile sizes), ranked out
   (its design not among the ``verify_top`` verified ones), or cut by ``_diverse`` (only
   ``ALTERNATIVES`` other extents of a design reach the profiler).

Decode-attention rows (``decode_attention``) are compared by their layout (``attn_layout``): kernels,
blocks, for-loop, and per block the batch rows, kv heads, q heads, KV splits and KV tile — the
q tile is [1, 1, 1, group, d] in the fixture and [1, 1, group, d] in the search's grouped core, so
tiles are compared without their unit dims. Besides the row's winner, every hand-written candidate
``bench_blocks.hand_written`` times (the fixture, its ``split_kv_tilings``, KV tiles 64 / 128) is
looked up among the search's candidates.
"""
from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import replace

ATTN = {"gqa", "qknorm", "decode_attention"}


def winning_rows(table: str) -> list[tuple[str, str, str]]:
    """(label, dtype, tiling) of every row whose winner is hand-written, from a bench_blocks table:
    the older single-column form (``fixture: grid …``) or the two-column one (hand-written faster)."""
    out, head = [], None
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| row |"):
            head = cells
            continue
        if head is None or not line.startswith("| ") or line.startswith("|---") or len(cells) != len(head):
            continue
        row = dict(zip(head, cells))
        if "μGraph (from), tiling, launch" in row:
            tiling = row["μGraph (from), tiling, launch"]
            if tiling.startswith("fixture:"):
                out.append((row["row"], row["dtype"], tiling.split(":", 1)[1].strip()))
        elif "hand-written tiling, launch" in row:
            try:
                hand, mine = float(row["hand-written (graph)"]), float(row["searched (graph)"])
            except ValueError:
                hand, mine = 0.0, float("inf")
            if hand and hand < mine:
                out.append((row["row"], row["dtype"], row["hand-written tiling, launch"]))
    return out


def parse_tiling(tiling: str) -> tuple[tuple[int, int, int], int, int]:
    """``grid 1x128x1 f16 w4s3`` -> ((1, 128, 1), 16, 128 threads)."""
    m = re.match(r"grid (\d+)x(\d+)x(\d+) f(\d+)(?: w(\d+))?", tiling)
    if m is None:
        raise ValueError(f"fixture_gap: cannot read the tiling {tiling!r}")
    warps = int(m.group(5) or 4)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))), int(m.group(4)), 32 * warps


def row_programs() -> dict[tuple[str, str], tuple[str, dict]]:
    """(label, dtype) -> (fixture name, shape kwargs) of every bench_blocks row."""
    from benchmarks.bench_blocks import llama_rows, paper_rows
    rows = [r for dt in ("bfloat16", "float16") for r in (*llama_rows(dt), *paper_rows(dt))]
    return {(label, dt): (name, kw) for label, name, kw, dt in rows}


def shape(g) -> tuple:
    """The first customized kernel of ``g`` as (blocks, for-loop, sorted input tile shapes)."""
    b = g.customized_nodes()[0].block
    return b.num_blocks, b.forloop, tuple(sorted(tuple(i.value.type.shape) for i in b.inputs))


def describe_kernel(g) -> str:
    n = g.customized_nodes()[0]
    b = n.block
    tiles = " ".join(f"{n.args[i.source]}{list(i.value.type.shape)}"
                     f"×{math.prod(b.grid[a] for a in range(3) if i.imap[a] == -1)}" for i in b.inputs)
    more = f" (+{len(g.customized_nodes()) - 1} kernels)" if len(g.customized_nodes()) > 1 else ""
    return f"grid {'x'.join(map(str, b.grid))} ({b.num_blocks} blocks) f{b.forloop} t{b.block_threads} {tiles}{more}"


def fixture_winner(name: str, kw: dict, dtype: str, tiling: str):
    from superopt.runtime.retile import retile
    from tests.fixtures.ugraphs import FIXTURES
    fx = FIXTURES[name](dtype=dtype, **kw)
    grid, forloop, threads = parse_tiling(tiling)
    idx = next(i for i, n in enumerate(fx.ugraph.nodes) if n.op == "customized")
    g = retile(fx.ugraph, idx, grid, forloop)
    node = g.nodes[idx]
    nodes = list(g.nodes)
    nodes[idx] = replace(node, block=replace(node.block, block_threads=threads))
    return fx.program, replace(g, nodes=tuple(nodes), _types=None)


def search_space(program, budget, arch: str = "sm_90") -> list[tuple]:
    """Every (design, kernel-0 node, cost µs of the whole design at the rest's best extents)
    the search ranks for ``program``, as ``superoptimize`` enumerates them, cheapest first (for a
    program with edge views or data movement: its lowered core's, ``search.movement.lower``)."""
    from superopt.abstract import analyze
    from superopt.search.budget import SearchStats
    from superopt.search.checkpoint import Checkpoint
    from superopt.search.driver import _kernel_options, _search
    from superopt.search.instantiate import build_kernel
    from superopt.search.kernel import enumerate_patterns
    from superopt.search.movement import LOWERED_OPS, lower
    from superopt.search.softmax import prepare

    if any(n.op in LOWERED_OPS for n in program.nodes):
        program = lower(program).core
    program = prepare(program)[0]
    index = analyze(program)
    patterns = enumerate_patterns(program, index, budget)
    stats = SearchStats()
    designs = _search(program, index, patterns, budget, time.time() + budget.max_seconds,
                      Checkpoint(None, "", {}, 0), stats)
    out = []
    for d in designs:
        types = {v.name: v.type for v in program.inputs}
        options = []
        for k in d:
            opts = _kernel_options(k, types, index, budget, arch, stats)
            if not opts:
                break
            build_kernel(k, types, index, opts[0][2])
            options.append(opts)
        else:
            rest = sum(o[0][1] for o in options[1:])
            out += [(d, node, cost + rest) for node, cost, *_ in options[0]]
    return sorted(out, key=lambda x: x[2])


def node_shape(node) -> tuple:
    b = node.block
    return b.num_blocks, b.forloop, tuple(sorted(tuple(i.value.type.shape) for i in b.inputs))


def attn_layout(g, kv_len: int) -> tuple:
    """A decode-attention μGraph's first kernel as (kernels, blocks, for-loop, batch rows, kv heads,
    q heads a block, KV splits, KV tile, sorted tiles without unit dims): the design's layout."""
    n = g.customized_nodes()[0]
    b = n.block
    tiles = {n.args[i.source]: i.value.type.shape for i in b.inputs}
    k = tiles["k"]                                    # [batch, kv heads, KV tile, d]
    q = tiles.get("q", tiles.get(next(a for a in tiles if a not in ("k", "v")), ()))
    heads = math.prod(q[:-1]) // (k[0] or 1)          # q rows a block serves per batch row
    splits = kv_len // (k[2] * b.forloop)
    squeezed = tuple(sorted(tuple(d for d in t if d != 1) for t in tiles.values()))
    return (len(g.customized_nodes()), b.num_blocks, b.forloop, k[0], k[1], heads, splits, k[2], squeezed)


def fmt_layout(lay: tuple) -> str:
    kern, blocks, f, rows, kvh, qh, splits, tile, _ = lay
    return (f"{kern}k {blocks} blocks: {rows} batch row(s) × {kvh} kv head(s) × {qh} q head(s) a block, "
            f"{splits} KV split(s) × tile {tile} × loop {f}")


def analyse_attention(label: str, dtype: str, name: str, kw: dict, program, won, budget) -> dict:
    """The attention row: the winner's and every hand-written candidate's layout among the search's."""
    from benchmarks.bench_blocks import hand_written
    from superopt.search import superoptimize
    L = kw["kv_len"]
    row = dict(label=label, dtype=dtype, winner=fmt_layout(attn_layout(won, L)))
    t0, c0 = time.perf_counter(), time.process_time()
    result = superoptimize(program, budget)
    # wall and CPU seconds: on a shared machine the wall clock runs into the budget first
    row["search_s"], row["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    row["time_budget_hit"] = result.stats.time_budget_hit
    cands = [g for g in result.candidates() if g.customized_nodes()]
    row["candidates"] = len(cands)
    if not cands:
        row.update(instances=0, enumerated=False, reached=False, search_best="none (the unfused program)",
                   hand_reached="0 of —", verdict="no fused design: " + "; ".join(result.stats.fallback_reasons))
        return row
    space = search_space(program, budget)
    row["instances"] = len(space)
    lays = [attn_layout(g, L) for g in cands]
    want = attn_layout(won, L)
    # the space holds each design's first kernel at every extent, the design gives the kernel count
    hits = [i for i, (d, node, _) in enumerate(space)
            if len(d) == want[0] and _node_layout(node, program, L) == want[1:]]
    row["enumerated"] = bool(hits)
    if hits:
        row.update(rank=hits[0] + 1)
    row["reached"] = want in lays
    hand = {attn_layout(g, L) for g in hand_written(name, kw, dtype)[1]}
    row["hand_reached"] = f"{len(hand & set(lays))} of {len(hand)}"
    row["search_best"] = fmt_layout(lays[0])
    row["splits"] = sorted({lay[6] for lay in lays if lay[0] > 1})
    row["group_rows"] = sorted({(lay[3], lay[4], lay[5]) for lay in lays if lay[0] > 1})
    row["verdict"] = ("offered to the profiler" if row["reached"] else
                      f"enumerated (rank {row['rank']} of {len(space)}), not offered" if hits else
                      "not enumerated")
    return row


def _node_layout(node, program, kv_len: int) -> tuple:
    """``attn_layout`` of a kernel node of the lowered core (no kernel count)."""
    from superopt.ir import KernelGraph
    g = KernelGraph(program.inputs, (node,), tuple(v.name for v in node.outs), "probe")
    return attn_layout(g, kv_len)[1:]


def analyse(label: str, dtype: str, tiling: str, name: str, kw: dict, budget) -> dict:
    from superopt.search import superoptimize
    program, won = fixture_winner(name, kw, dtype, tiling)
    if name == "decode_attention":
        return analyse_attention(label, dtype, name, kw, program, won, budget)
    row = dict(label=label, dtype=dtype, winner=describe_kernel(won), winner_shape=shape(won))
    if name in ATTN:  # the paper suite's GQA / QKNorm: [heads, L, d] programs, attn_layout reads [b, Hkv, L, d]
        row["verdict"] = "paper attention: not analysed (attn_layout reads the decode layout only)"
        return row
    t0 = time.perf_counter()
    result = superoptimize(program, budget)
    row["search_s"] = time.perf_counter() - t0
    cands = [g for g in result.candidates() if g.customized_nodes()]
    row["candidates"] = len(cands)
    space = search_space(program, budget)
    row["instances"] = len(space)
    want = shape(won)
    # same blocks, loop and tiles; "structure": same columns per block and K per iteration, i.e. the
    # same tile multiset, whatever the block count (a design that splits the rows too differs here)
    hits = [i for i, (_, node, _) in enumerate(space) if node_shape(node) == want]
    same_tiles = [i for i, (_, node, _) in enumerate(space) if node_shape(node)[2] == want[2]]
    row["enumerated"] = bool(hits)
    row["same_tiles"] = len(same_tiles)
    if hits:
        i = hits[0]
        d_i, node, cost = space[i]
        row.update(rank=i + 1, cost=cost, best_cost=space[0][2], design=d_i)
    row["reached"] = any(shape(g) == want for g in cands)
    best_cand = cands[0] if cands else None
    row["search_best"] = describe_kernel(best_cand) if best_cand is not None else "none"
    if row["reached"]:
        row["verdict"] = "offered to the profiler"
    elif not hits:
        row["verdict"] = ("not enumerated: no design at this block count / loop / tiles "
                          f"({len(same_tiles)} instances with the same tiles at other block counts)")
    else:
        from superopt.search.skeleton import design_key
        verified = {design_key(d) for d, _ in result.designs if d is not None}
        every = [g for g in result.candidates(designs=len(result.ranked), limit=10 ** 6) if g.customized_nodes()]
        why = ("its design was ranked out of the verify_top verified families"
               if design_key(row["design"]) not in verified else
               "this extent was cut by _diverse/ALTERNATIVES" if not any(shape(g) == want for g in every) else
               "cut by the candidates' limit or families (SearchResult.candidates)")
        row["verdict"] = (f"enumerated (rank {row['rank']} of {len(space)}, {row['cost']:.1f} µs vs the pick's "
                          f"{row['best_cost']:.1f}), not offered: {why}")
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", help="a bench_blocks.py result table (markdown)")
    ap.add_argument("--only", default="", help="comma-separated substrings of row labels")
    ap.add_argument("--search-s", type=float, default=20.0, help="search budget per row, as bench_blocks")
    ap.add_argument("--cost-params", metavar="FILE.json",
                    help="rank with the cost constants fitted for sm_90 in FILE (cost_vs_measured --fit)")
    args = ap.parse_args(argv)
    from superopt.search import SearchBudget
    from superopt.search.cost import load_params
    params = load_params(args.cost_params, "sm_90") if args.cost_params else None
    if args.cost_params and params is None:
        raise SystemExit(f"{args.cost_params} holds no constants for sm_90")
    with open(args.table) as f:
        rows = winning_rows(f.read())
    if args.only:
        rows = [r for r in rows if any(s in r[0] for s in args.only.split(","))]
    progs = row_programs()
    budget = SearchBudget(max_seconds=args.search_s, cost_params=params)
    attn = [r for r in rows if progs[(r[0], r[1])][0] == "decode_attention"]
    rows = [r for r in rows if r not in attn]
    if attn:
        print("| row | dtype | hand-written winner | search s (CPU s) | instances ranked | same layout enumerated | "
              "cost rank | reached profiler (of candidates) | hand-written layouts reached | "
              "KV splits offered | (batch rows, kv heads, q heads) a block offered | search's top candidate | why |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, dtype, tiling in attn:
        name, kw = progs[(label, dtype)]
        r = analyse(label, dtype, tiling, name, kw, budget)
        cpu = f"{r['cpu_s']:.1f}" + (", budget hit" if r["time_budget_hit"] else "")
        print(f"| {label} | {dtype} | {r['winner']} | {r['search_s']:.1f} ({cpu}) | {r['instances']} | "
              f"{'yes' if r['enumerated'] else 'no'} | {r.get('rank', '—')} | "
              f"{'yes' if r['reached'] else 'no'} ({r['candidates']}) | {r['hand_reached']} | "
              f"{r.get('splits', '—')} | {r.get('group_rows', '—')} | {r['search_best']} | {r['verdict']} |",
              flush=True)
    if not rows:
        return
    print("| row | dtype | fixture winner (kernel shape) | search s | instances ranked | same shape enumerated | "
          "cost rank | reached profiler (of candidates) | search's top candidate | why |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, dtype, tiling in rows:
        name, kw = progs[(label, dtype)]
        r = analyse(label, dtype, tiling, name, kw, budget)
        print(f"| {label} | {dtype} | {r['winner']} | {r.get('search_s', 0):.1f} | {r.get('instances', '—')} | "
              f"{'yes' if r.get('enumerated') else 'no' if 'enumerated' in r else '—'} | "
              f"{r.get('rank', '—')} | {'yes' if r.get('reached') else 'no'} ({r.get('candidates', '—')}) | "
              f"{r.get('search_best', '—')} | {r['verdict']} |", flush=True)


if __name__ == "__main__":
    main()
