"""The layout rules of docs/architecture.md, enforced: import direction (superopt's subpackages, and
mirage_serve's modules and packages), torch only at the edges, a cheap ``import superopt.ir``, no source
file over 800 lines, every package folder installed."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 800

# superopt subpackage -> the superopt subpackages it may import (docs/architecture.md "Import direction":
# ir <- interp <- abstract, verify <- search; lax, layout, codegen on ir; runtime on codegen;
# pipeline on all). abstract may use lax: its axioms are written as Lax programs (a builder on ir).
ALLOWED = {
    "ir": set(),
    "interp": {"ir"},
    "lax": {"ir"},
    "layout": {"ir"},
    "codegen": {"ir"},
    "abstract": {"ir", "interp", "lax"},
    "verify": {"ir", "interp"},
    "search": {"ir", "interp", "lax", "abstract", "verify"},
    "runtime": {"ir", "codegen"},
    "pipeline": {"ir", "interp", "lax", "layout", "codegen", "abstract", "verify", "search", "runtime"},
}
NEVER_IN_SUPEROPT = {"mirage_serve", "transformers", "patches"}
HEAVY = {"torch", "triton"}
# the edges where torch / triton may appear (docs/architecture.md: lax extraction, runtime, a torch Domain)
HEAVY_OK = ("superopt/runtime/", "superopt/lax/extract.py", "superopt/interp/torch_domain.py")


def _sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders if (ROOT / f).is_dir() for p in (ROOT / f).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Absolute module names imported by ``path`` (relative imports resolved), with line numbers."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])  # the package a relative import starts from (also for __init__)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                names = [node.module]
            out += [(n, node.lineno) for n in names]
    return out


def _subpackage(path: Path) -> str:
    parts = path.relative_to(ROOT / "superopt").with_suffix("").parts
    return parts[0]


SUPEROPT = _sources("superopt")


@pytest.mark.parametrize("path", SUPEROPT, ids=lambda p: str(p.relative_to(ROOT)))
def test_superopt_import_direction(path):
    own = _subpackage(path)
    rel = str(path.relative_to(ROOT))
    problems = []
    for mod, line in _imports(path):
        top = mod.split(".")[0]
        if top in NEVER_IN_SUPEROPT:
            problems.append(f"{rel}:{line} imports {mod}: superopt never imports {top}")
        if top in HEAVY and not rel.startswith(HEAVY_OK):
            problems.append(f"{rel}:{line} imports {mod}: torch/triton only in {', '.join(HEAVY_OK)}")
        if top == "superopt" and own != "__init__":
            parts = mod.split(".")
            target = parts[1] if len(parts) > 1 else "superopt"
            if target == own:
                continue
            if own not in ALLOWED:
                problems.append(f"{rel}: superopt.{own} is not in tests/test_layout.py ALLOWED; add its "
                                f"place in docs/architecture.md's import direction")
            elif target not in ALLOWED[own]:
                problems.append(f"{rel}:{line} imports {mod}: superopt.{own} may import only "
                                f"{sorted(ALLOWED[own]) or 'nothing else in superopt'}")
    assert not problems, "\n".join(problems)


# mirage_serve's modules and packages in layers, lowest first (docs/architecture.md, "Import
# direction"): a unit imports only units of lower layers, so the patch machinery never reaches up to
# a front end (bench, CLI, warm) and the kernel store, the family adapters and the decode runner
# each stay below patch(). A package is one unit (mirage_serve.cache, mirage_serve.decode, the
# adapters of patches/), except cache.warm: the ahead-of-time front end, which runs patch().
MIRAGE_LAYERS = (
    {"patching.stacking"},                             # q/k/v weights stacked into one (torch only)
    {"knobs", "cli_errors", "hf_names", "registry", "report", "backends", "verify_parallel", "cost_fit",
     "patching.sites", "patching.trace", "patching.handoff", "patching.forward_rewrite"},  # leaves
    {"options", "progress", "site_kernel", "patches", "cache", "tp",
     "patching.partition", "patching.residual", "patching.final_norm", "patching.lm_head"},  # switches, kernel
    # store, adapters, shards; traced sites, residual plan, the model's final norm and output projection
    {"optimize", "patching.pairing"},                 # cache or search, then verify; k/v pairing
    {"patching.prepare"},                             # one site: extract, choose, verify, build, self-check
    {"patching.install"},                             # swap forwards, restore them
    {"decode"},                                       # decode attention, CUDA-graph decode steps
    {"patching.pipeline"},                            # patch() / unpatch(): the stages in order
    {"patching.programs", "bench_load", "bench_sampling", "bench_timing", "bench_plot", "cache.warm"},
    {"bench", "tp.cli_tp"},                           # bench; its tensor-parallel loaders
    {"cli_bench", "cli_cache"},
    {"cli"},
)
MIRAGE_RANK = {unit: i for i, layer in enumerate(MIRAGE_LAYERS) for unit in layer}


def _mirage_unit(path: Path) -> str | None:
    """The layer unit of a file of mirage_serve or patches/ (None: the package's lazy __init__)."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    if rel[0] == "patches":
        return "patches"
    if rel[1:] in (("__init__",), ("patching", "__init__")):
        return None
    if rel[1:] in (("cache", "warm"), ("tp", "cli_tp")) or (rel[1] == "patching" and len(rel) == 3):
        return ".".join(rel[1:])  # patching/: each module has its own place (the stages of patch())
    return rel[1]


def _mirage_target(mod: str) -> str | None:
    parts = mod.split(".")
    if parts[0] != "mirage_serve" or len(parts) < 2:
        return None
    if parts[1:3] in (["cache", "warm"], ["tp", "cli_tp"]) or (parts[1] == "patching" and len(parts) >= 3):
        return ".".join(parts[1:3])
    return None if parts[1] == "patching" else parts[1]  # the package itself: its __init__ imports nothing


@pytest.mark.parametrize("path", _sources("mirage_serve", "patches"), ids=lambda p: str(p.relative_to(ROOT)))
def test_mirage_serve_import_direction(path):
    own = _mirage_unit(path)
    if own is None:
        return
    rel = str(path.relative_to(ROOT))
    assert own in MIRAGE_RANK, (f"{rel}: mirage_serve.{own} is not in tests/test_layout.py MIRAGE_LAYERS; "
                                f"give it its place in the import direction (docs/architecture.md)")
    problems = []
    for mod, line in _imports(path):
        target = _mirage_target(mod)
        if target is None or target == own:
            continue
        if target not in MIRAGE_RANK:
            problems.append(f"{rel}:{line} imports {mod}: mirage_serve.{target} is not in MIRAGE_LAYERS")
        elif MIRAGE_RANK[target] >= MIRAGE_RANK[own]:
            problems.append(f"{rel}:{line} imports {mod}: mirage_serve.{own} (layer {MIRAGE_RANK[own]}) may "
                            f"import only lower layers; {target} is layer {MIRAGE_RANK[target]}")
    assert not problems, "\n".join(problems)


def test_mirage_serve_layers_name_every_module():
    units = {_mirage_unit(p) for p in _sources("mirage_serve", "patches")} - {None}
    assert units <= set(MIRAGE_RANK), sorted(units - set(MIRAGE_RANK))
    assert set(MIRAGE_RANK) <= units, f"MIRAGE_LAYERS names modules that are gone: {sorted(set(MIRAGE_RANK) - units)}"


def test_importing_ir_and_verify_is_cheap():
    code = ("import sys, superopt.ir; heavy = {'torch', 'numpy', 'triton'} & set(sys.modules); "
            "assert not heavy, heavy; import superopt.lax, superopt.interp, superopt.verify; "
            "heavy = {'torch', 'triton', 'transformers'} & set(sys.modules); assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("path", _sources("superopt", "mirage_serve", "patches", "benchmarks"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_over_800_lines(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (limit {MAX_LINES}): split it by responsibility"


def test_every_package_folder_is_installed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = {pkg: folder for pkg, folder in cfg.get("package-dir", {}).items() if pkg}
    found = {}
    for top, name in (("superopt", "superopt"), ("mirage_serve", "mirage_serve")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found[".".join((name,) + rel)] = init.parent
    for pkg, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found[".".join((pkg,) + rel)] = init.parent
    missing = sorted(p for p in found if p not in listed and "__pycache__" not in str(found[p]))
    assert not missing, (f"package folders missing from pyproject.toml [tool.setuptools] packages "
                         f"(they would not be installed): {missing}")


_REPORT_WRITE = re.compile(r"\breport\.\w+\s*(\+=|-=|=(?!=))|\breport\.\w+\.(append|extend|update)\(|"
                           r"\breport\.\w+\[[^\]]*\]\s*=(?!=)")


def test_only_the_patch_pipeline_writes_the_patch_report():
    # issue 28: patch() is a pipeline of named stages and "nothing else writes the report" (docs/architecture.md)
    assert _REPORT_WRITE.search("self.report.searches += 1") and _REPORT_WRITE.search("report.sites.append(sr)")
    assert not _REPORT_WRITE.search("if report.searches == 0:")
    writers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "mirage_serve").rglob("*.py")
                     if _REPORT_WRITE.search(p.read_text()))
    assert writers == ["mirage_serve/patching/pipeline.py"], writers
