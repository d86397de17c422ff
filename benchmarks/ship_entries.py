"""Bring entries a GPU machine exported (``gpu_session.sh warm``'s shipped.tar, unpacked) into kernels_cache/.

    python benchmarks/ship_entries.py EXPORTED_DIR [--into kernels_cache] [--only LABEL,...]

A new entry is added; one whose μGraph kernels_cache/ already holds keeps its default launch and gains the
exporting GPU's launch as a row (``mirage_serve.cache.gpu_rows``), so shipping an H200's timings leaves the
H100's in place; one with another μGraph replaces the shipped one. ``--only`` limits it to entries whose
label (``mlp_out-m8``) is listed. Prints one line an entry: what was done.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mirage_serve.cache.archive import ship_into

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exported", type=Path, help="a folder of shipped-form entries (export_shipped's)")
    ap.add_argument("--into", type=Path, default=REPO / "kernels_cache", help="the shipped cache to update")
    ap.add_argument("--only", default="", metavar="LABELS", help="entry labels to take, comma-separated")
    args = ap.parse_args(argv)
    for name, folder in (("EXPORTED_DIR", args.exported), ("--into", args.into)):
        if not folder.is_dir():
            ap.error(f"{name}: {folder} is not a folder of cache entries")
    only = set(filter(None, args.only.split(",")))
    for name, action in ship_into(args.exported, args.into, only or None):
        print(f"{name}: {action}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
