"""Bring entries a GPU machine exported (``gpu_session.sh warm``'s shipped.tar, unpacked) into kernels_cache/.

    python benchmarks/ship_entries.py EXPORTED_DIR [--into kernels_cache] [--only LABEL,...]

A new entry is added; one whose μGraph kernels_cache/ already holds keeps its default launch and gains the
exporting GPU's launch as a row (``mirage_serve.cache.gpu_rows``), so shipping an H200's timings leaves the
H100's in place; one with another μGraph replaces the shipped one. ``--only`` limits it to entries whose
label (``mlp_out-m8``) is listed. Prints one line an entry: what was done.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from mirage_serve.cache.archive import ship_into

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exported", type=Path, help="a folder of shipped-form entries (export_shipped's)")
    ap.add_argument("--into", type=Path, default=REPO / "kernels_cache", help="the shipped cache to update")
    ap.add_argument("--only", default="", metavar="LABELS", help="entry labels to take, comma-separated")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    src = args.exported
    if only:   # the listed entries alone, in a folder of their own
        src = Path(tempfile.mkdtemp(prefix="ship_only."))
        for d in args.exported.iterdir():
            if d.is_dir() and d.name.rsplit("-", 1)[0] in only:
                shutil.copytree(d, src / d.name)
    try:
        for name, action in ship_into(src, args.into):
            print(f"{name}: {action}")
    finally:
        if only:
            shutil.rmtree(src, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
