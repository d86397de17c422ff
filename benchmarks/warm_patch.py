"""Time patch() in a fresh process over a filled kernel cache, to the end of the first decode step.

    python benchmarks/warm_patch.py Llama-3.1-8B --batch 1,8

Prints patch()'s counts (searches, compiles, cache hits) and seconds: with a warm cache both counts
should be 0. Run it after `mirage-serve warm` (or a bench) has filled $MIRAGE_SERVE_CACHE_DIR.
``--cold``: patch over an empty user cache and no shipped cache (every program searched, verified,
compiled and profiled) and print the whole report, whose table gives each site's cost.
"""
from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", default="1,8", help="decode buckets to patch, e.g. 1,8")
    ap.add_argument("--cold", action="store_true", help="empty user cache, no shipped cache; print the report")
    args = ap.parse_args(argv)
    import torch

    import mirage_serve
    from mirage_serve.bench_load import load

    buckets = tuple(int(b) for b in args.batch.split(","))
    cache_dir = None
    if args.cold:
        import tempfile

        from mirage_serve.cache import store

        store.shipped_cache_dir = lambda: None   # KernelCache's default shipped layer: none
        cache_dir = tempfile.mkdtemp(prefix="cold-cache-")
    lm = load(args.model, dtype="bf16", device="cuda")
    ids = torch.randint(1, lm.facts["vocab_size"], (1, 32), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    report = mirage_serve.patch(lm.model, batch_sizes=buckets, cache_dir=cache_dir)
    t_patch = time.perf_counter() - t0
    with torch.no_grad():
        lm.model.generate(ids, max_new_tokens=2, do_sample=False)  # prefill + first decode step
    torch.cuda.synchronize()
    t_first = time.perf_counter() - t0
    print(report if args.cold else str(report).splitlines()[-1])
    spent: dict[str, float] = {}
    for site in report.sites:
        for what, sec in site.times.items():
            spent[what] = spent.get(what, 0.0) + sec
    print("patch time by stage (all sites): " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(spent.items())))
    print(f"{lm.name}: patch {t_patch:.2f} s ({report.searches} searches, {report.compiles} compiles, "
          f"{report.cache_hits} cache hits); first decode step done {t_first:.2f} s after patch() began")


if __name__ == "__main__":
    main()
