"""Is B faster than A? `mirage-serve bench` alternated between two source trees (or two settings) on one GPU.

    python benchmarks/ab_trees.py MODEL [MODEL ...] --a-dir OLD_TREE --b-dir . [--batch 1] [--rounds 2]
    python benchmarks/ab_trees.py MODEL --b-env MIRAGE_SERVE_PDL=0          # one tree, two settings

Why: one bench process's reading of a 0.5-1B model at batch 1 can be 10-15% off in a short or cold run, while
256-token, 5-repeat runs alternated on one warm machine agree within 0.5% (session 35,
benchmarks/results/floor_h100_2026-11-28_s35/README.md). A change worth a few percent needs that protocol.

Each round runs every model once with A, then once with B. Each run is a fresh process that imports the project from
its tree's directory (``PYTHONPATH``, so a tree needs no install; its patches/, models/ and kernels_cache/ too,
whichever tree is installed), with a kernel cache of each side's own, and with no baselines. The output prints each
run's ms/step and whether its timed repeats gave the same tokens, B / A as the ratio of the medians, and the spread of
each side (max − min over median). A ratio whose distance from 1 is smaller than the larger spread is reported as
inside the noise.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mirage_serve.bench import spread_pct


# patches/, models/ and kernels_cache/ sit beside mirage_serve/ and install as its subpackages (pyproject's
# package-dir): with the project installed in editable mode, ``import mirage_serve.kernels_cache`` from any tree on
# PYTHONPATH found the *installed* tree's folder, so A ran B's shipped kernels, patches and registry (session 41 caught
# it: an A/B of shipped entries compared B with itself). This finder, first on sys.meta_path, maps them to the tree's.
_TREE_BOOT = """import importlib.util, runpy, sys
from pathlib import Path
tree = Path(sys.argv.pop(1))
class TreeFolders:
    def find_spec(self, name, path=None, target=None):
        head, _, sub = name.partition(".")
        init = tree / sub / "__init__.py"
        if head == "mirage_serve" and sub in ("patches", "models", "kernels_cache") and init.is_file():
            return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
        return None
sys.meta_path.insert(0, TreeFolders())
sys.argv[0] = "mirage-serve"
runpy.run_module("mirage_serve.cli", run_name="__main__", alter_sys=True)
"""


def bench_command(model: str, batch: str, repeats: int, json_path: Path, tree: Path) -> list[str]:
    """``mirage-serve bench`` run from ``tree`` alone: its mirage_serve/ (``PYTHONPATH``) and its patches/, models/
    and kernels_cache/ as mirage_serve's subpackages (``_TREE_BOOT``), whatever tree is installed."""
    return [sys.executable, "-c", _TREE_BOOT, str(tree), "bench", model, "--batch", batch, "--baselines", ",",
            "--repeats", str(repeats), "--json", str(json_path)]


def repeat_words(divergence: dict | None) -> str:
    """Whether a run's timed repeats gave the same tokens (the bench JSON's ``repeats``): a sum whose order varies
    between launches can flip a near-tied token (``PatchOptions.deterministic``)."""
    if not divergence:
        return "same tokens in every timed repeat"
    return "tokens moved between repeats at " + ", ".join(f"{k} {v}" for k, v in divergence.items())


def ours_ms(report: dict) -> dict[int, float]:
    """{batch: ms/step} of the ``ours`` rows of a bench JSON."""
    return {row["batch"]: row["ms_per_step"] for row in report["rows"] if row["run"] == "ours"}


def summarize(runs: dict[tuple[str, str, int], list[float]]) -> list[dict]:
    """Per (model, batch): A's and B's runs, B / A of the medians, each side's spread, and whether the gap is
    inside the noise. ``runs``: (model, side "a" or "b", batch) -> ms/step of each run."""
    out = []
    for model, batch in dict.fromkeys((m, b) for m, _, b in runs):
        a, b = runs.get((model, "a", batch), []), runs.get((model, "b", batch), [])
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        # one run a side has no spread to judge the gap by (the bench's own measure of it, over runs here)
        sides = [spread_pct(x) for x in (a, b)]
        spread = None if None in sides else max(sides) / 100
        out.append(dict(model=model, batch=batch, a=a, b=b, ratio=mb / ma, spread=spread,
                        noise=None if spread is None else abs(mb / ma - 1) <= spread))
    return out


def _runs(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


def table(rows: list[dict]) -> str:
    lines = [f"{'model':<16} {'batch':>5}  {'A ms/step':<22} {'B ms/step':<22} {'B / A':>6}  {'spread':>6}  verdict"]
    for r in rows:
        side = "B faster" if r["ratio"] < 1 else "B slower"
        verdict = {None: f"{side}? (one run a side: no spread)", True: "inside the noise", False: side}[r["noise"]]
        spread = "-" if r["spread"] is None else f"{100 * r['spread']:.1f}%"
        lines.append(f"{r['model']:<16} {r['batch']:>5}  {_runs(r['a']):<22} {_runs(r['b']):<22} {r['ratio']:>6.3f}  "
                     f"{spread:>6}  {verdict}")
    return "\n".join(lines)


def _env(pairs: list[str], tree: Path, cache_dir: Path) -> dict:
    """A side's environment: its tree first on the path, a kernel cache of its own (``cache_dir``), then its settings.

    A side needs its own cache: a patch stores every shipped entry it verified, at the launch it ran, in the user cache,
    and the next patch takes that entry before the shipped one. With one cache for both, the side that ran first set
    the μGraphs and launches of both (session 43: an A/B of two shipped caches compared one with itself)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MIRAGE_SERVE_CACHE_DIR"] = str(cache_dir)
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--a-env / --b-env take NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--a-dir", type=Path, default=Path("."), help="tree A (default: this one)")
    ap.add_argument("--b-dir", type=Path, default=Path("."), help="tree B (default: this one)")
    ap.add_argument("--a-env", nargs="*", default=[], metavar="NAME=VALUE", help="environment of A's runs")
    ap.add_argument("--b-env", nargs="*", default=[], metavar="NAME=VALUE", help="environment of B's runs")
    ap.add_argument("--batch", default="1", help="comma list, as the bench takes it")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a run (one that passes it is dropped)")
    args = ap.parse_args(argv)
    for side in ("a", "b"):
        if not (getattr(args, f"{side}_dir") / "mirage_serve").is_dir():
            raise SystemExit(f"--{side}-dir {getattr(args, f'{side}_dir')}: no mirage_serve/ there; pass a source "
                             f"tree (e.g. `git archive REV | tar -x -C DIR`)")
    runs: dict[tuple[str, str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for model in args.models:
                for side in ("a", "b"):
                    tree = getattr(args, f"{side}_dir").resolve()
                    path = Path(tmp) / f"{model}_{side}_{r}.json"
                    try:
                        done = subprocess.run(bench_command(model, args.batch, args.repeats, path, tree), cwd=tree,
                                              env=_env(getattr(args, f"{side}_env"), tree, Path(tmp) / f"cache_{side}"),
                                              capture_output=True,
                                              text=True, timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        print(f"round {r + 1} {model} {side.upper()}: over {args.timeout:.0f} s, dropped", flush=True)
                        continue
                    if done.returncode != 0:
                        print(f"round {r + 1} {model} {side.upper()}: failed (exit {done.returncode}):\n"
                              f"{done.stderr[-2000:]}", flush=True)
                        continue
                    report = json.loads(path.read_text())
                    moved = report.get("repeats", {}).get("ours", {})
                    for batch, ms in ours_ms(report).items():
                        runs.setdefault((model, side, batch), []).append(ms)
                        print(f"round {r + 1} {model} b{batch} {side.upper()}: {ms:.3f} ms/step, "
                              f"{repeat_words(moved.get(str(batch)))}", flush=True)
    print()
    print(table(summarize(runs)))


if __name__ == "__main__":
    main()
