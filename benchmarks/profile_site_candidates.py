"""Every candidate the GPU profiler times for one site program, with its time or its error.

    python benchmarks/profile_site_candidates.py Gemma-3-1B mlp_in --batch 8

``patch()`` keeps only the winner of the profile and its timings (``meta.timings``); when the winner is
the program itself (library kernels) the entry says nothing of why every fused design lost. This runs
the same search (``search_candidates.site_program``, the budget ``patch()`` gives the Triton backend, the
largest bucket) and the same profiler (``superopt.runtime.select.Selector``) on random inputs, and prints
each candidate: its kernels' grids, the cost model's µs, the measured µs and launch, or the error that
made it lose. Cross-block sums are timed as ``patch()`` builds them: in a fixed order unless
``MIRAGE_SERVE_DETERMINISTIC=0`` (``PatchOptions.deterministic``); run it both ways to see what the order costs a
split-K candidate. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="registry name, e.g. Gemma-3-1B")
    ap.add_argument("program", help="site program: attn_in, attn_in_1, attn_out, mlp_in, mlp_out, norm, ...")
    ap.add_argument("--batch", type=int, default=8, help="rows (the decode bucket), default 8")
    ap.add_argument("--tried", action="store_true", help="also every launch timed for each candidate, with its µs")
    args = ap.parse_args()

    import torch

    from mirage_serve import knobs, optimize
    from search_candidates import describe, site_program
    from superopt.runtime.dtypes import TORCH_DTYPES
    from superopt.runtime.profile import config_label
    from superopt.runtime.select import Selector
    from superopt.search import SearchBudget, superoptimize
    from superopt.search.cost import graph_cost

    program = site_program(args.model, args.program, [args.batch])[args.batch]
    result = superoptimize(program, optimize.default_budget(None, "triton") or SearchBudget(), arch="sm_90")
    cands = result.candidates()
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(v.type.shape, generator=gen).to("cuda", TORCH_DTYPES[v.type.dtype]) for v in program.inputs]
    ordered = knobs.DETERMINISTIC.get()
    selector = Selector(torch.device("cuda"), ordered_sums=ordered)
    try:
        ranked = selector.pick(cands, inputs)
    finally:
        selector.close()
    print(f"== {args.model} {args.program} at {args.batch} rows: {len(cands)} candidates, "
          f"{sum(r.error is None for r in ranked)} ran; cross-block sums {'ordered' if ordered else 'atomic adds'}")
    for r in ranked:
        tag = "  (the program unfused)" if r.ugraph == program else ""
        if r.error is None:
            launch = " ".join(sorted({config_label(c) for c in r.launch.values()})) or "default"
            print(f"candidate {r.index}: {r.median_us:.1f} µs at {launch}, cost model {graph_cost(r.ugraph):.1f} µs{tag}")
            if args.tried:
                print("    tried: " + ", ".join(f"{config_label(c)} {us:.1f}" for c, us in r.tried))
        else:
            print(f"candidate {r.index}: FAILED {r.error[:300]}{tag}")
        print("\n".join(describe(r.ugraph)[:3]))


if __name__ == "__main__":
    main()
