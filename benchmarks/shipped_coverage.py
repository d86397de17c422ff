"""Which registry models the shipped kernels_cache/ covers: per model, the site programs of one
decoder layer at each batch bucket (with and without the fused residual adds), and whether a
shipped entry holds each (sm90, bf16, triton).

    python benchmarks/shipped_coverage.py [MODEL ...] [--batch 1,2,4,8,16] [--remove attn_in,attn_in_1] [--prune]

Runs on the CPU in a minute or two: each model is built with one decoder layer and a small
vocabulary (bf16), its site programs are extracted as patch() extracts them, and their shipped
cache keys are looked up. A miss means a user of that model pays a search on first patch();
`mirage-serve warm MODEL` on the GPU machine, exported into kernels_cache/, fills it.
A hit whose stored launch was timed on source the code generator no longer writes (a stale launch,
``mirage_serve.cache.stale_launches``) costs that user its launches timed again instead: seconds to tens of seconds
an entry (21.4 s for Llama-3.1-8B's 1-row gate/up on an H200, session 46). Each model's line names those, and the
end prints the ``gpu_session.sh warm`` calls whose export (``ship_entries.py``) gives them a current row for that GPU.
``--remove LABELS`` deletes the listed site programs' shipped entries of the named models, and their
entries in the user cache (``MIRAGE_SERVE_CACHE_DIR``; an earlier patch copied shipped hits there, and
they would stand in for the shipped ones), so that the next ``warm`` searches them again (after a
change to the search or its cost model).
``--prune`` (all models) deletes the entries no registry model uses at these buckets (programs a
change to the site layout left behind), so the package ships only what a patch can hit. It keeps the output
projections' (lm_head-*), which this script does not extract.
"""
from __future__ import annotations

import argparse
import shutil
from collections import defaultdict
from pathlib import Path

from mirage_serve.cache.stale_launches import stale_launches


def programs(name: str, buckets: tuple[int, ...]):
    """(site program label, bucket, program digest) of one layer of registry model ``name``, with the
    residual adds in o_proj / down_proj and without (``MIRAGE_SERVE_FUSED_RESIDUAL=0``, or a layer
    whose forward ``patch()`` does not recognise, e.g. after a transformers upgrade)."""
    from mirage_serve.patching.programs import layer_programs
    from superopt.ir import digest

    for fused in (True, False):
        for label, m, g in layer_programs(name, buckets, fused_residual=fused):
            yield label, m, digest(g)


def cache_keys(name: str, buckets: tuple[int, ...]):
    """(label, bucket, the user cache's ``CacheKey``) of each of ``programs(name, buckets)`` as patch()
    keys it on this machine's toolchain (sm90, bf16, triton); ``for_shipped()`` gives the shipped key."""
    from mirage_serve.cache import CacheKey, versions_now

    for label, m, dg in programs(name, buckets):
        yield label, m, CacheKey(dg, f"b{m}", "bf16", "sm90", "triton", versions_now(), f"{label}-m{m}")


def paired_in_use(shipped: Path, used: set[str]) -> set[str]:
    """The paired-launch entries (k/v as one launch) of the programs in ``used``: they are keyed by
    the chosen μGraph and launch, not by a program, so they are matched by their μGraph text."""
    texts = {(shipped / d / "ugraph.txt").read_text() for d in used if (shipped / d / "ugraph.txt").is_file()}
    return {p.name for p in shipped.iterdir()
            if p.name.split("-")[-2:-1] == ["paired"] and (p / "ugraph.txt").is_file()
            and (p / "ugraph.txt").read_text() in texts}


def _print_refresh(refresh: dict[str, set[int]]) -> None:
    """The warm calls that re-time the stale launches found (models grouped by the buckets they need)."""
    calls = defaultdict(list)
    for name, buckets in sorted(refresh.items()):
        calls[",".join(map(str, sorted(buckets)))].append(name)
    if calls:
        print("stale launches are timed again on a user's first patch; to ship a current row for a GPU, run there:")
        for buckets, names in calls.items():
            print(f'  WARM_MODELS="{" ".join(names)}" WARM_BATCH={buckets} bash benchmarks/gpu_session.sh warm')
        print("  then here: python benchmarks/ship_entries.py <the last call's shipped.tar, unpacked>/shipped")


def main(argv=None) -> None:
    from mirage_serve import registry
    from mirage_serve.cache import KernelCache, default_cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="registry names (default: all)")
    ap.add_argument("--batch", default="1,2,4,8,16")
    ap.add_argument("--remove", default="", metavar="LABELS",
                    help="comma-separated site programs (e.g. attn_in,attn_in_1) whose entries to delete")
    ap.add_argument("--shipped", default=str(Path(__file__).resolve().parents[1] / "kernels_cache"),
                    help="the shipped cache to check (default: this checkout's kernels_cache/)")
    ap.add_argument("--prune", action="store_true",
                    help="delete the entries no registry model uses (needs all models: give none)")
    args = ap.parse_args(argv)
    if args.prune and args.models:
        ap.error("--prune looks at every registry model: give no model names")
    buckets = tuple(int(b) for b in args.batch.split(","))
    cache = KernelCache(cache_dir=Path(args.shipped) / ".no-user-layer", shipped_dir=args.shipped, read_only=True)
    remove = set(filter(None, args.remove.split(",")))
    if remove and not args.models:
        ap.error("--remove needs the models whose entries to delete")
    stale = defaultdict(list)   # entry folder -> its stale launches: "default" or a GPU's row
    for entry, row, _ in stale_launches(Path(args.shipped)):
        stale[entry].append(row)
    missing_any, used, refresh = False, set(), defaultdict(set)   # refresh: model -> buckets with stale launches
    for name in args.models or registry.names():
        seen, missing, timed_again = set(), [], []
        for label, m, key in cache_keys(name, buckets):
            if key in seen:
                continue
            seen.add(key)
            shipped_name = key.for_shipped().dirname()
            used.add(shipped_name)
            if label in remove:
                user_entry = default_cache_dir(None) / key.dirname()
                for entry in (Path(args.shipped) / shipped_name, user_entry):
                    if entry.is_dir():
                        shutil.rmtree(entry)
                        print(f"{name}: removed {label}@b{m} ({entry.parent.name}/{entry.name})")
            if cache.get(key) is None:
                missing.append(f"{label}@b{m}")
            elif shipped_name in stale:
                timed_again.append(f"{label}@b{m} ({', '.join(stale[shipped_name])})")
                refresh[name].add(m)
        missing_any |= bool(missing)
        print(f"{name:18} {len(seen) - len(missing):3}/{len(seen):3} programs shipped"
              + (f"; missing: {', '.join(missing)}" if missing else "")
              + (f"; stale launches: {', '.join(timed_again)}" if timed_again else ""))
    _print_refresh(refresh)
    if args.prune:
        used |= paired_in_use(Path(args.shipped), used)
        # the output projections' entries are kept: patch() runs one only where an entry holds it
        # (PatchOptions.lm_head "cached"), and extracting its program here would build the full vocabulary matrix
        unused = sorted(p for p in Path(args.shipped).iterdir() if (p / "meta.json").is_file() and p.name not in used
                        and not p.name.startswith("lm_head-"))
        for p in unused:
            shutil.rmtree(p)
        print(f"pruned {len(unused)} entries no registry model uses")
    raise SystemExit(1 if missing_any else 0)


if __name__ == "__main__":
    main()
