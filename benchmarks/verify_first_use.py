"""Time the first-use verification of a registry model's shipped μGraphs, as patch() runs it, on the CPU.

    PYTHONPATH=$PWD python benchmarks/verify_first_use.py Llama-3.1-8B            # all at once (patch())
    PYTHONPATH=$PWD python benchmarks/verify_first_use.py Llama-3.1-8B --one-by-one --trials 8

Builds one layer's site programs from the registry config (no weights, ``patching.programs``), looks up
each in the shipped ``kernels_cache/``, widens it to the program's precision as patch() does
(``superopt.verify.upcast``) and verifies it against the program at the real shape with
``verify_parallel``: by default every check is started first (``prefetch``, as patch() does) and
collected after; ``--one-by-one`` waits for each before starting the next (patch() before this
change); ``--trials 8`` forces 8 trials (the old fixed count) instead of ``trials_for(ε)``. Prints
each program's verdict and the total wall time; the pool uses every core but one.
"""
from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--one-by-one", action="store_true")
    ap.add_argument("--trials", type=int, default=0, help="force this many trials (0: trials_for(eps))")
    a = ap.parse_args(argv)
    from mirage_serve import verify_parallel
    from mirage_serve.cache import CacheKey, KernelCache, shipped_cache_dir, versions_now
    from mirage_serve.patching.programs import layer_programs
    from superopt.ir import digest, from_text
    from superopt.verify.upcast import upcast

    if a.trials:
        verify_parallel.MIN_TRIALS = verify_parallel.TRIALS = a.trials
    rows = tuple(int(b) for b in a.batch.split(","))
    t0 = time.perf_counter()
    seen = {}
    for label, m, g in layer_programs(a.model, rows):
        seen.setdefault((digest(g), m), (label, m, g))
    cache = KernelCache(shipped_cache_dir() / ".no-user-layer", read_only=True)
    pairs = []
    for (dg, m), (label, _, g) in seen.items():
        e = cache.get(CacheKey(dg, f"b{m}", "bf16", "sm90", "triton", versions_now(), f"{label}-m{m}"))
        if e is None:
            print(f"{label} b{m}: not in the shipped cache")
        else:
            pairs.append((label, m, g, upcast(g, from_text(e.ugraph_text))[0]))   # as patch() verifies it
    print(f"extract + look-up: {time.perf_counter() - t0:.1f} s, {len(pairs)} shipped μGraphs")
    t0 = time.perf_counter()
    if not a.one_by_one:
        for _, _, g, c in pairs:
            verify_parallel.prefetch(g, c)
    for label, m, g, c in pairs:
        v = verify_parallel.check(g, c)
        print(f"  {label} b{m}: {v} (done {time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"verify: {time.perf_counter() - t0:.1f} s for {len(pairs)} μGraphs "
          f"({'one by one' if a.one_by_one else 'all at once'}, {a.trials or 'trials_for(ε)'} trials)")


if __name__ == "__main__":
    main()
