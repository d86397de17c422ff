"""What the GPU profiler would be given for one site program: the search's designs, on a CPU.

    python benchmarks/search_candidates.py Llama-3.1-8B attn_in_1 --batch 16,8 [--search-each]

As ``patch()`` does: the program (a site part, ``mirage_serve.patching.sites.site_parts``: attn_in is q,
attn_in_1 is k and v, mlp_in is gate/up, attn_out and mlp_out the projections alone) is traced at
the largest bucket and searched there (sm_90, the search budget patch() gives the Triton backend);
every smaller bucket re-instantiates that search's designs. ``--search-each`` searches every bucket
instead, to see what re-instantiation leaves out. Per bucket: the ranked designs, then the graphs
the profiler would time (``SearchResult.candidates``), each kernel as grid, threads, for-loop
iterations, its input tiles per iteration (``×n``: n blocks read the same tile) and the cost model's
µs; with ``--aot``, each candidate kernel compiled for sm_90 (registers, spills, shared memory — what
made the cost model's [16, 1024] picks slow: ~130 KB of shared memory, one block an SM). Nothing is
timed: a tool for work on the search space and the cost model (does a design reach the profiler at
all?); the times that decide are the GPU profiler's.
"""
from __future__ import annotations

import argparse
import math


def resources(g) -> dict[int, str]:
    """Per customized node of ``g``: its kernel compiled ahead of time for sm_90 at the renderer's
    default launch — registers and spills (ptxas -v of Triton's PTX) and Triton's shared memory."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    from superopt.codegen.triton import render_triton
    from superopt.runtime.aot import aot_compile

    tm = render_triton(g)
    built = aot_compile(tm)
    out = {}
    for spec in tm.kernels:
        k = built[spec.name]
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(k.asm["ptx"])
            f.flush()
            log = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                                 capture_output=True, text=True).stderr
        regs = re.search(r"Used (\d+) registers", log)
        spill = re.search(r"(\d+) bytes spill stores", log)
        out[spec.node_index] = (f"{regs.group(1) if regs else '?'} regs, {spill.group(1) if spill else '?'} B spilled, "
                                f"{k.metadata.shared / 1024:.0f} KB smem")
    return out


def describe(g, aot: bool = False) -> list[str]:
    """One line per kernel of μGraph ``g`` (with ``aot``: its compiled resources, ``resources``)."""
    from superopt.search.cost import node_cost

    compiled = resources(g) if aot else {}
    lines = []
    for idx, n in enumerate(g.nodes):
        args = [g.type_of(a) for a in n.args]
        cost = node_cost(n, args)
        if n.block is None:
            if cost:
                lines.append(f"    {n.op} -> {list(n.out.type.shape)}: {cost:.2f} µs")
            continue
        b = n.block
        tiles = []
        for inp in b.inputs:
            readers = math.prod(b.grid[a] for a in range(3) if inp.imap[a] == -1)
            tiles.append(f"{n.args[inp.source]}{list(inp.value.type.shape)}×{readers}")
        lines.append(f"    grid {tuple(b.grid)} threads {b.block_threads} loop {b.forloop} "
                     f"tiles {' '.join(tiles)}: {cost:.2f} µs" + (f"; {compiled[idx]}" if idx in compiled else ""))
    return lines


def site_program(model_name: str, label: str, rows: list[int]):
    """{rows: program} of the site part ``label`` of the registry model's first layer, as patch()
    extracts it (``mirage_serve.patching.programs``)."""
    from mirage_serve.patching.programs import layer_programs

    found: dict[int, object] = {}
    labels = []
    for name, m, g in layer_programs(model_name, tuple(rows)):
        labels.append(name)
        if name == label:
            found.setdefault(m, g)  # k and v: one program, the first part speaks for both
    if not found:
        raise SystemExit(f"{model_name} has no site program {label!r}; it has: {', '.join(dict.fromkeys(labels))}")
    return found


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="registry name, e.g. Llama-3.1-8B")
    ap.add_argument("program", help="site program: attn_in, attn_in_1, attn_out, mlp_in, mlp_out, norm")
    ap.add_argument("--batch", default="16,8", help="buckets, the largest searched first (default 16,8)")
    ap.add_argument("--search-each", action="store_true", help="search every bucket, not re-instantiate")
    ap.add_argument("--aot", action="store_true",
                    help="compile each candidate for sm_90 (no GPU needed): registers, spills, shared memory")
    args = ap.parse_args(argv)
    from mirage_serve import optimize
    from superopt.search import SearchBudget, superoptimize

    rows = sorted({int(b) for b in args.batch.split(",")}, reverse=True)
    programs = site_program(args.model, args.program, rows)
    budget = optimize.default_budget(None, "triton") or SearchBudget()
    searched = None
    for m in rows:
        if searched is None or args.search_each:
            result, how = superoptimize(programs[m], budget, arch="sm_90"), "searched"
            searched = searched or result
        else:
            result, how = searched.reinstantiate(programs[m]), f"re-instantiated from m{rows[0]}"
        st = result.stats.summary()
        print(f"== {args.program} at {m} rows: {how}; {st.get('instances')} instances, "
              f"{st.get('verified')} verified, {sum(result.stats.seconds.values()):.1f} s")
        for i, (g, cost) in enumerate(result.ranked):
            print(f"  design {i}: {cost:.2f} µs{'  (the program unfused)' if g == programs[m] else ''}")
            print("\n".join(describe(g)))
        cands = result.candidates()
        print(f"  the profiler would time {len(cands)}:")
        for j, g in enumerate(cands):
            print(f"  candidate {j}:")
            print("\n".join(describe(g, args.aot)))


if __name__ == "__main__":
    main()
