"""benchmarks/ab_trees.py: alternated bench runs of two trees, and the verdict on their ratio."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "ab_trees.py"
_spec = importlib.util.spec_from_file_location("ab_trees", _PATH)
ab = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ab
_spec.loader.exec_module(ab)

# A tree whose "bench" writes the JSON rows the real one writes, its ms/step taken from the environment (and the
# tree's own constant): proof of which tree and which environment each run got.
_FAKE_CLI = '''
import json, os, sys
args = sys.argv[1:]
path = args[args.index("--json") + 1]
ms = float(os.environ.get("FAKE_MS", "1.0")) * TREE_FACTOR
batches = [int(b) for b in args[args.index("--batch") + 1].split(",")]
rows = [{"run": "ours", "batch": b, "ms_per_step": ms * b} for b in batches]
rows.append({"run": "eager", "batch": 1, "ms_per_step": 99.0})
json.dump({"rows": rows}, open(path, "w"))
'''


def _tree(root: Path, factor: float) -> Path:
    (root / "mirage_serve").mkdir(parents=True)
    (root / "mirage_serve" / "__init__.py").write_text("")
    (root / "mirage_serve" / "cli.py").write_text(f"TREE_FACTOR = {factor}\n" + _FAKE_CLI)
    return root


def test_runs_alternate_each_tree_from_its_own_directory(tmp_path, capsys):
    a, b = _tree(tmp_path / "a", 1.0), _tree(tmp_path / "b", 0.8)
    ab.main(["m1", "m2", "--a-dir", str(a), "--b-dir", str(b), "--batch", "1,8", "--rounds", "2"])
    out = capsys.readouterr().out
    order = [line.split(":")[0] for line in out.splitlines() if line.startswith("round")]
    assert order == [f"round {r} {m} b{bt} {s}" for r in (1, 2) for m in ("m1", "m2") for s in "AB" for bt in (1, 8)]
    assert "round 1 m1 b8 B: 6.400 ms/step" in out  # tree b's factor, its batch
    rows = [line.split() for line in out.splitlines() if line.startswith(("m1 ", "m2 "))]
    assert len(rows) == 4 and all("0.800" in r and "faster" in r for r in rows)


def test_each_tree_runs_its_own_shipped_kernels_whatever_tree_is_installed(tmp_path, capsys):
    # the fake CLI takes its factor from its tree's kernels_cache/, imported as mirage_serve.kernels_cache: with the
    # project installed in editable mode that name would otherwise be the installed tree's folder
    cli = _FAKE_CLI.replace("* TREE_FACTOR", "* float(importlib.resources.files('mirage_serve.kernels_cache')"
                            ".joinpath('factor.txt').read_text())")
    trees = []
    for name, factor in (("a", "1.0"), ("b", "0.5")):
        tree = _tree(tmp_path / name, 1.0)
        (tree / "mirage_serve" / "cli.py").write_text("import importlib.resources\n" + cli)
        (tree / "kernels_cache").mkdir()
        (tree / "kernels_cache" / "__init__.py").write_text("")
        (tree / "kernels_cache" / "factor.txt").write_text(factor)
        trees.append(tree)
    ab.main(["m", "--a-dir", str(trees[0]), "--b-dir", str(trees[1]), "--rounds", "1"])
    out = capsys.readouterr().out
    assert "round 1 m b1 A: 1.000" in out and "round 1 m b1 B: 0.500" in out, out


def test_one_tree_two_environments(tmp_path, capsys):
    tree = _tree(tmp_path / "t", 1.0)
    ab.main(["m", "--a-dir", str(tree), "--b-dir", str(tree), "--b-env", "FAKE_MS=1.25", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "round 1 m b1 A: 1.000" in out and "round 1 m b1 B: 1.250" in out
    assert "B slower? (one run a side: no spread)" in out


def test_a_gap_smaller_than_either_sides_spread_is_noise():
    rows = ab.summarize({("m", "a", 1): [1.00, 1.10], ("m", "b", 1): [0.98, 1.00],
                         ("n", "a", 1): [1.00, 1.001], ("n", "b", 1): [0.90, 0.901]})
    by = {r["model"]: r for r in rows}
    assert by["m"]["noise"] and by["m"]["ratio"] == pytest.approx(0.99 / 1.05)
    assert not by["n"]["noise"] and by["n"]["ratio"] < 1
    assert "inside the noise" in ab.table(rows) and "B faster" in ab.table(rows)


def test_a_directory_without_the_project_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--a-dir .*no mirage_serve"):
        ab.main(["m", "--a-dir", str(tmp_path)])


def test_each_side_keeps_a_kernel_cache_of_its_own(tmp_path, capsys):
    # a patch stores what it verified in the user cache and the next patch takes it from there: the fake CLI keeps
    # its tree's factor in the cache on its first run and runs whatever the cache holds, as a patch runs the
    # entry it finds. One cache for both sides would give B the factor of A, which ran first (session 43).
    cli = _FAKE_CLI.replace("* TREE_FACTOR", "* cached()").replace("import json, os, sys", '''import json, os, sys
def cached():
    entry = os.path.join(os.environ["MIRAGE_SERVE_CACHE_DIR"], "entry")
    if not os.path.exists(entry):
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        open(entry, "w").write(str(TREE_FACTOR))
    return float(open(entry).read())''')
    a, b = _tree(tmp_path / "a", 1.0), _tree(tmp_path / "b", 0.5)
    for tree in (a, b):
        (tree / "mirage_serve" / "cli.py").write_text(f"TREE_FACTOR = {0.5 if tree is b else 1.0}\n" + cli)
    ab.main(["m", "--a-dir", str(a), "--b-dir", str(b), "--rounds", "2"])
    out = capsys.readouterr().out
    assert "round 2 m b1 A: 1.000" in out and "round 2 m b1 B: 0.500" in out, out


def test_each_run_says_whether_its_timed_repeats_gave_the_same_tokens(tmp_path, capsys):
    tree = _tree(tmp_path / "t", 1.0)
    cli = (tree / "mirage_serve" / "cli.py").read_text().replace(
        'json.dump({"rows": rows}', 'json.dump({"rows": rows, "repeats": {"ours": {"1": None, "8": '
        '{"step": 99, "row": 4, "expected": 1, "got": 2}}}}')
    (tree / "mirage_serve" / "cli.py").write_text(cli)
    ab.main(["m", "--a-dir", str(tree), "--batch", "1,8", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "round 1 m b1 A: 1.000 ms/step, same tokens in every timed repeat" in out
    assert "round 1 m b8 A: 8.000 ms/step, tokens moved between repeats at step 99, row 4" in out, out
