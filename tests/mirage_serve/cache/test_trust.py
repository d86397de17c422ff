"""Cache trust, one test per abuse of a writable cache directory or an archive (issue 32): nothing
from a cache runs, or is believed, without being rendered again or verified again."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mirage_serve import optimize
from mirage_serve.cache import CacheEntry, CacheKey, CacheWarning, KernelCache, records, trust
from mirage_serve.cache.audit import audit
from mirage_serve.cache.entry import write_entry
from superopt.codegen.launch import Launch
from superopt.ir import digest, to_text
from tests.fixtures.ugraphs import FIXTURES

from ._helpers import make_entry, make_key

ROOT = Path(__file__).resolve().parents[3]
CASE = "rmsnorm_matmul_odd"   # rows 3, hidden 90, out 70: a fused kernel with masked tiles


def _fixture():
    return FIXTURES["rmsnorm_matmul"](dtype="float32", rows=3, hidden=90, out=70)


def _key(program, backend="triton") -> CacheKey:
    return CacheKey(digest(program), "b3", "fp32", "cpu", backend, (("superopt", "0.1.0"),), "rmsnorm_matmul-m3")


def _forge(root: Path, key: CacheKey, entry: CacheEntry) -> Path:
    """What a hostile writer of the cache directory can do: a whole entry with every hash right."""
    d = root / key.dirname()
    d.mkdir(parents=True)
    write_entry(d, key, entry)
    return d


def _payload(marker: Path, body: str) -> str:
    return f"open({str(marker)!r}, 'w').write('pwned')\n" + body


# ------------------------------------------------------------------ the secret


def test_secret_is_created_private_reused_and_refused_when_unsafe(tmp_path):
    path = tmp_path / "cfg" / "cache-key"
    s = trust.user_secret(path)
    assert len(s) == 32 and oct(path.stat().st_mode & 0o777) == "0o600" and trust.user_secret(path) == s
    loose = tmp_path / "loose"
    loose.write_text(os.urandom(32).hex())
    loose.chmod(0o644)
    link = tmp_path / "link"
    link.symlink_to(path)
    short = tmp_path / "short"
    short.write_text("ab\n")
    short.chmod(0o600)
    for bad, why in ((loose, "0644"), (link, "Too many levels|symbolic link"), (short, "malformed")):
        with pytest.warns(trust.TrustWarning, match=why):
            assert trust.user_secret(bad) is None


def test_a_forged_mac_does_not_sign(tmp_path):
    cache = KernelCache(tmp_path, shipped_dir=False, secret=b"s" * 32)
    cache.put(make_key(0), make_entry(0))
    assert cache.get(make_key(0)).signed
    # the same entry under another user's secret: its binaries are not handed out, and verify says so
    other = KernelCache(tmp_path, shipped_dir=False, secret=b"t" * 32)
    got = other.get(make_key(0))
    assert not got.signed and got.binaries == {} and got.sources == {}
    assert [r.reason for r in other.verify(("user",))] == ["MAC does not check: written under another secret, "
                                                           "or tampered with"]


# ------------------------------------------------------------------ forged source never runs


def test_forged_source_never_runs_on_the_triton_path(tmp_path):
    """A source.py that would write a file, in a forged entry (every hash right, no MAC) and even in
    one this user signed: the Triton interpreter runs the rendered module, never the stored one."""
    fx = _fixture()
    from superopt.codegen.triton import render_triton

    rendered = render_triton(fx.ugraph).source
    marker = tmp_path / "pwned"
    forged_key = _key(fx.program)
    signed_key = _key(fx.program, backend="triton-signed")
    bogus = {"rmsnorm.0123456789abcdef.cubin": b"\x7fELF not a kernel"}
    _forge(tmp_path / "c", forged_key,
           CacheEntry(to_text(fx.ugraph), {"source.py": _payload(marker, rendered)}, bogus, {"verified": True}))
    KernelCache(tmp_path / "c", shipped_dir=False).put(
        signed_key, CacheEntry(to_text(fx.ugraph), {"source.py": _payload(marker, rendered)}, {}, {}))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for key, signed in ((forged_key, False), (signed_key, True)):
        r = subprocess.run([sys.executable, "-m", "tests.mirage_serve.cache._trust_worker", str(tmp_path / "c"),
                            json.dumps(key.fields()), CASE], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["signed"] is signed and out["binaries"] == 0 and out["rendered"] is True
        assert out["err"] <= 1e-5, out          # fp32, against the float64 program
        assert not marker.exists()


def test_compile_graph_takes_no_source():
    import inspect

    from superopt.runtime.compiled import CompiledGraph, compile_graph

    for fn in (compile_graph, CompiledGraph.__init__):
        assert "source" not in inspect.signature(fn).parameters


# ------------------------------------------------------------------ forged μGraph, stored verdict


def _forged_eps(program) -> str:
    text = to_text(program)
    assert "value=1e-06" in text
    return text.replace("value=1e-06", "value=1.001e-06")


def test_forged_ugraph_with_its_old_verdict_is_rejected_by_verification(tmp_path):
    fx = _fixture()
    key = _key(fx.program, backend="torch")
    _forge(tmp_path, key, CacheEntry(_forged_eps(fx.program), {}, {}, {"verified": True,
                                                                         "verdict": "equivalent: 8 trials"}))
    cache = KernelCache(tmp_path, shipped_dir=False)
    with pytest.warns(CacheWarning, match="rejected: it failed verification"):
        choice = optimize.choose(fx.program, budget=0, arch="sm_90", cache=cache, key=key)
    assert choice.source == "fallback" and choice.graph == fx.program      # the forgery never runs
    assert cache.stats.rejected and not (tmp_path / key.dirname()).exists()


def test_unsigned_hit_is_verified_then_signed_and_a_signed_one_believed(tmp_path, monkeypatch):
    fx = _fixture()
    key = _key(fx.program, backend="torch")
    shipped = tmp_path / "shipped"
    _forge(shipped, key.for_shipped(), CacheEntry(to_text(fx.ugraph), {}, {}, {"verified": True}))
    cache = KernelCache(tmp_path / "user", shipped_dir=shipped)
    calls = []
    real = optimize.verify
    monkeypatch.setattr(optimize, "verify", lambda p, g: calls.append(g) or real(p, g))
    first = optimize.choose(fx.program, budget=0, arch="sm_90", cache=cache, key=key)
    assert first.source == "cache" and first.graph == fx.ugraph and first.verification.ok and len(calls) == 1
    stored = cache.get(key)
    assert stored.origin == "user" and stored.signed and stored.meta["verified"] is True
    again = optimize.choose(fx.program, budget=0, arch="sm_90", cache=KernelCache(tmp_path / "user"), key=key)
    assert again.graph == fx.ugraph and again.verification.ok and len(calls) == 1   # believed: signed


def test_an_entry_of_format_1_is_read_as_unsigned_text_then_rewritten(tmp_path):
    import hashlib

    from mirage_serve.cache import entry as entry_mod

    fx = _fixture()
    key = _key(fx.program, backend="torch")
    d = _forge(tmp_path, key, CacheEntry(to_text(fx.ugraph), {"source.py": "x = 1\n"}, {"k.cubin": b"\x7fELF"},
                                         {"verified": True}))
    doc = json.loads((d / "meta.json").read_text())   # as the previous release wrote it: format 1
    doc["format"] = 1
    del doc["self_sha256"]
    doc["self_sha256"] = hashlib.sha256(entry_mod._canonical(doc)).hexdigest()
    (d / "meta.json").write_text(json.dumps(doc))
    cache = KernelCache(tmp_path, shipped_dir=False)
    got = cache.get(key)
    assert not got.signed and got.binaries == {} and got.sources == {}
    choice = optimize.choose(fx.program, budget=0, arch="sm_90", cache=cache, key=key)
    assert choice.graph == fx.ugraph and choice.verification.verdict.startswith("equivalent")
    assert json.loads((d / "meta.json").read_text())["format"] == 2 and cache.get(key).signed


def test_stale_launch_of_a_shipped_entry_is_profiled_again(tmp_path):
    fx = _fixture()
    key = _key(fx.program)
    shipped = tmp_path / "shipped"
    from superopt.codegen.triton import render_triton

    name = render_triton(fx.ugraph).kernels[0].name
    _forge(shipped, key.for_shipped(), CacheEntry(to_text(fx.ugraph), {}, {}, {
        "launch": {name: [8, 2]}, "render_sha256": "0" * 64, "median_us": 1.0}))   # profiled on other code
    timed = []

    def pick(result):
        timed.append(result.candidates())
        assert result.incumbent == fx.ugraph   # every launch of the cached μGraph is swept
        return optimize.Pick(fx.ugraph, {name: Launch(4, 3)}, 2.5, "fastest", optimize.verify(fx.program, fx.ugraph))

    cache = KernelCache(tmp_path / "user", shipped_dir=shipped)
    choice = optimize.choose(fx.program, budget=0, arch="sm_90", cache=cache, key=key, pick=pick)
    assert timed == [[fx.ugraph]] and choice.launch == {name: Launch(4, 3)} and choice.source == "cache"
    meta = cache.get(key).meta
    assert meta["launch"] == {name: [4, 3]} and meta["render_sha256"] != "0" * 64
    # still current: the next patch profiles nothing
    timed.clear()
    assert optimize.choose(fx.program, budget=0, arch="sm_90", cache=KernelCache(tmp_path / "user"),
                           key=key, pick=pick).launch == {name: Launch(4, 3)} and timed == []


# ------------------------------------------------------------------ symlinks


def test_symlinks_are_refused_everywhere(tmp_path):
    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    for i in (0, 1):
        cache.put(make_key(i), make_entry(i))
    meta = cache.root / make_key(0).dirname() / "meta.json"
    outside = tmp_path / "outside.json"
    outside.write_bytes(meta.read_bytes())          # identical bytes, outside the cache
    meta.unlink()
    meta.symlink_to(outside)
    with pytest.warns(CacheWarning, match="meta.json is a symlink"):
        assert cache.get(make_key(0)) is None
    # an entry directory that is a link to a good entry elsewhere is no entry
    elsewhere = tmp_path / "elsewhere"
    (cache.root / make_key(1).dirname()).rename(elsewhere)
    (cache.root / make_key(1).dirname()).symlink_to(elsewhere, target_is_directory=True)
    assert cache.get(make_key(1)) is None
    result = audit(cache, layers=("user",))
    links = sorted(f.path.name for f in result.findings if f.kind == "symlink")
    assert links == sorted(["meta.json", make_key(1).dirname()])
    assert any(f.kind == "entry" and "symlink" in f.problem for f in result.findings)
    assert [f.kind for f in audit(cache, layers=("user",)).bad].count("symlink") == 2
    # a link planted at an entry's name, or at CACHEDIR.TAG, is replaced, never written through
    cache.put(make_key(1), make_entry(1))
    assert cache.get(make_key(1)).signed and (elsewhere / "meta.json").exists()
    tag_target = tmp_path / "tag-target"
    (cache.root / "CACHEDIR.TAG").unlink()
    (cache.root / "CACHEDIR.TAG").symlink_to(tag_target)
    KernelCache(cache.root, shipped_dir=False)
    assert not tag_target.exists()
    audit(cache, layers=("user",), remove=True)
    assert outside.exists() and (elsewhere / "meta.json").exists()   # the links went, never their targets
    assert not audit(cache, layers=("user",)).bad


def test_programs_dir_as_a_symlink_is_never_written_through(tmp_path):
    torch = pytest.importorskip("torch")
    from mirage_serve.cache.programs import ProgramMemo
    from superopt.lax.extract import Extracted

    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    (cache.root / "programs").symlink_to(victim, target_is_directory=True)
    fx = _fixture()
    with pytest.warns(CacheWarning, match="program record not stored"):
        ProgramMemo(cache).put("a" * 64, Extracted(fx.program, tuple(("arg", 0) for _ in fx.program.inputs)))
    assert list(victim.iterdir()) == [] and torch is not None
    assert [f.kind for f in audit(cache, layers=("user",)).bad] == ["symlink"]


# ------------------------------------------------------------------ program records


def _records(cache: KernelCache) -> dict[str, Path]:
    """Four signed records, then each abused: a flipped byte, a truncation, a symlink, and a forgery
    with its sha256 recomputed (no MAC)."""
    folder = cache.root / "programs"
    folder.mkdir()
    fx = _fixture()
    body = {"text": to_text(fx.program), "digest": digest(fx.program), "sources": [["arg", 0]]}
    paths = {}
    for i, how in enumerate(("flip", "truncate", "symlink", "forged", "good")):
        p = folder / f"{i:064x}.json"
        p.write_bytes(records.encode(body, cache.secret))
        paths[how] = p
    data = paths["flip"].read_bytes()
    at = data.index(b"1e-06")
    paths["flip"].write_bytes(data[:at] + b"2" + data[at + 1:])
    paths["truncate"].write_bytes(paths["truncate"].read_bytes()[:-7])
    paths["symlink"].unlink()
    paths["symlink"].symlink_to(paths["good"])
    forged = {**body, "text": _forged_eps(fx.program)}
    paths["forged"].write_bytes(records.encode(forged, None))
    return paths


def test_program_records_are_verified(tmp_path):
    pytest.importorskip("torch")
    from mirage_serve.cache.programs import ProgramMemo

    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    paths = _records(cache)
    memo = ProgramMemo(cache)
    for how, p in paths.items():
        if how == "good":
            assert memo.get(p.stem) is not None
            continue
        with pytest.warns(CacheWarning, match="ignoring program record"):
            assert memo.get(p.stem) is None, how
    found = {f.path.name: (f.kind, f.problem) for f in audit(cache, layers=("user",)).bad}
    assert found[paths["flip"].name][0] == "program" and "hash" in found[paths["flip"].name][1]
    assert "malformed" in found[paths["truncate"].name][1]
    assert "not signed" in found[paths["forged"].name][1]
    assert {k for k, _ in found.values()} == {"program", "symlink"} and paths["good"].name not in found


# ------------------------------------------------------------------ imported archives


def test_imported_tar_with_forged_entries_is_verified_never_executed(tmp_path):
    fx = _fixture()
    marker = tmp_path / "pwned"
    key = _key(fx.program, backend="torch")
    honest_key = _key(fx.program, backend="torch-honest")
    staged = tmp_path / "staged"
    _forge(staged, key, CacheEntry(_forged_eps(fx.program), {"source.py": _payload(marker, "")},
                                   {"k.cubin": b"\x7fELF"}, {"verified": True}))
    _forge(staged, honest_key, CacheEntry(to_text(fx.ugraph), {}, {}, {"verified": True}))
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        for f in sorted(staged.glob("*/*")):
            ti = tarfile.TarInfo(f"{f.parent.name}/{f.name}")
            ti.size = f.stat().st_size
            tar.addfile(ti, io.BytesIO(f.read_bytes()))
    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    report = audit(cache, layers=("user",), archives=[archive])
    assert any("carries k.cubin, source.py" in f.problem and not f.bad for f in report.findings)
    with pytest.warns(CacheWarning, match="dropped"):
        assert cache.import_(archive) == 2
    assert sorted(p.name for p in cache.root.glob("*/*")) == ["meta.json"] * 2 + ["ugraph.txt"] * 2
    with pytest.warns(CacheWarning, match="failed verification"):
        assert optimize.choose(fx.program, budget=0, arch="sm_90", cache=cache, key=key).graph == fx.program
    honest = optimize.choose(fx.program, budget=0, arch="sm_90", cache=cache, key=honest_key)
    assert honest.graph == fx.ugraph and honest.verification.verdict.startswith("equivalent")
    assert not marker.exists()


# ------------------------------------------------------------------ the rest of `cache verify`


def test_verify_warns_about_writable_dirs_and_cli_takes_cache_dir_after_the_verb(tmp_path, capsys):
    from mirage_serve.cli import main

    cache = KernelCache(tmp_path / "c", shipped_dir=False)
    cache.put(make_key(0), make_entry(0))
    cache.root.chmod(0o777)
    assert main(["cache", "ls", "--cache-dir", str(cache.root)]) == 0
    assert make_key(0).dirname() in capsys.readouterr().out
    assert main(["cache", "verify", "--cache-dir", str(cache.root)]) == 0     # a warning is no failure
    out = capsys.readouterr().out
    assert "warn permissions" in out and "world-writable" in out and "permissions:" in out
    (cache.root / make_key(0).dirname() / "ugraph.txt").write_text("graph forged\n")
    assert main(["cache", "--cache-dir", str(cache.root), "verify"]) != 0
    assert "BAD  entry" in capsys.readouterr().out


def test_archive_does_not_import_the_store():
    import ast

    tree = ast.parse((ROOT / "mirage_serve" / "cache" / "archive.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "store" not in imported
    fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert not [f.name for f in fns for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]


# ------------------------------------------------------------------ the precision rule on first use


def test_unsigned_entry_computing_narrower_than_the_program_is_widened_or_rejected(tmp_path):
    """A shipped design that squares and sums an RMSNorm in bf16 (the program: fp32) runs only
    widened to fp32 (superopt.verify.upcast), and is stored so; one that cannot be widened (the
    narrow ops outside a kernel) is rejected as the search would prune it."""
    from superopt.ir import from_text
    from superopt.verify.precision import precision_violations
    from tests.superopt.verify.test_upcast import PROGRAM, SHIPPED

    program, shipped = from_text(PROGRAM), from_text(SHIPPED)
    key = CacheKey(digest(program), "b3", "bf16", "cpu", "torch", (("superopt", "0.1.0"),), "norm-m3")
    _forge(tmp_path / "shipped", key.for_shipped(), CacheEntry(SHIPPED, {}, {}, {"verified": True}))
    cache = KernelCache(tmp_path / "user", shipped_dir=tmp_path / "shipped")
    choice = optimize.choose(program, budget=0, arch="sm_90", cache=cache, key=key)
    assert choice.source == "cache" and "2 op(s) widened" in choice.note and choice.verification.ok
    assert choice.graph != shipped and precision_violations(program, choice.graph) == []
    stored = cache.get(key)
    assert stored.signed and from_text(stored.ugraph_text) == choice.graph

    narrow = PROGRAM.replace(
        '%t1 = square(%t0) : float32[3,40]\n%t2 = reduce_sum(%t1) [dim=1, keepdim=1] : float32[3,1]',
        '%s1 = square(%x0) : bfloat16[3,40]\n%s2 = reduce_sum(%s1) [dim=1, keepdim=1] : bfloat16[3,1]\n'
        '%t2 = cast(%s2) [dtype="float32"] : float32[3,1]')
    key2 = CacheKey(digest(program), "b3", "bf16", "cpu", "torch-2", (("superopt", "0.1.0"),), "norm-m3")
    _forge(tmp_path / "user", key2, CacheEntry(narrow, {}, {}, {"verified": True}))
    with pytest.warns(CacheWarning, match="computes narrower than the program: square in bfloat16"):
        assert optimize.choose(program, budget=0, arch="sm_90", cache=cache, key=key2).graph == program
