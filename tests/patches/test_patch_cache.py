"""patch() with a search and a kernel cache: searched once, verified, then served from the cache.

The search is a stand-in (``superopt.search`` may not be installed yet): it returns the program
under another name, so the μGraph differs from the program and the real verifier runs on it.
"""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
from transformers import LlamaConfig

import mirage_serve
from mirage_serve.cache import CacheWarning
from superopt.search import SearchBudget

from .parity import build


class _Result:
    def __init__(self, best):
        self.best = best


def _fake_search(monkeypatch, calls: list):
    def superoptimize(program, budget=None, arch=None):
        calls.append((program.name, arch))
        return _Result(dataclasses.replace(program, name=program.name + "_searched"))

    mod = types.ModuleType("superopt.search")
    mod.SearchBudget = SearchBudget  # the real budget: only the search itself is faked
    mod.superoptimize = superoptimize
    monkeypatch.setitem(sys.modules, "superopt.search", mod)


def test_search_once_then_cache_hits(monkeypatch, tmp_path):
    calls: list = []
    _fake_search(monkeypatch, calls)
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    ids = torch.tensor([[7], [3]])
    with torch.no_grad():
        ref = model(ids).logits

    first = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    assert not first.unpatched, str(first)
    assert first.searches == 5 and len(calls) == 5  # one per distinct program (stacked q/k/v, gate+up, o, down, norm), not per layer
    assert {a for _, a in calls} == {"sm_90"}  # the GPU target, even for the CPU backend
    assert all(s.source == "search" and s.verdict.startswith("equivalent") for s in first.sites)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-5)
    mirage_serve.unpatch(model)

    second = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    assert second.searches == 0 and second.cache_hits == 5 and len(calls) == 5
    assert all(s.source == "cache" for s in second.sites)
    assert "5 cache hits" in str(second)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-5)
    mirage_serve.unpatch(model)


def test_an_entry_without_a_stored_verdict_is_verified_once_then_trusted(monkeypatch, tmp_path):
    """Entries written before verdicts were stored (and shipped ones exported from them) are
    verified on their first hit, and the verdict is written back: the next patch verifies nothing."""
    from mirage_serve import optimize
    from mirage_serve.cache import KernelCache

    _fake_search(monkeypatch, [])
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=1,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    mirage_serve.unpatch(model)
    cache = KernelCache(tmp_path, shipped_dir=False)
    for info in cache.ls(("user",)):  # strip the verdicts, as an older release wrote them
        key = info.key
        entry = cache.get(key, count=False)
        meta = {k: v for k, v in entry.meta.items() if k not in ("verified", "verdict")}
        cache.put(key, dataclasses.replace(entry, meta=meta), replace_existing=True)

    verified = []
    real_verify = optimize.verify
    monkeypatch.setattr(optimize, "verify", lambda p, g: verified.append(p.name) or real_verify(p, g))
    again = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    assert again.cache_hits == 5 and len(verified) == 5
    assert all(s.verdict.startswith("equivalent") for s in again.sites)
    mirage_serve.unpatch(model)
    assert all(KernelCache(tmp_path, shipped_dir=False).get(i.key, count=False).meta["verified"] is True
               for i in cache.ls(("user",)))

    verified.clear()
    third = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    assert third.cache_hits == 5 and verified == []
    assert all(s.verdict.startswith("verified when cached: equivalent") for s in third.sites)


def test_searched_graph_that_does_not_build_falls_back_to_the_program(monkeypatch):
    calls: list = []
    _fake_search(monkeypatch, calls)
    from mirage_serve import backends

    real = backends.build

    def refuse_searched(graph, backend, device, *args, **kwargs):
        if graph.name.endswith("_searched"):
            raise RuntimeError("codegen does not cover this μGraph")
        return real(graph, backend, device, *args, **kwargs)

    monkeypatch.setattr(backends, "build", refuse_searched)
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=1,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    report = mirage_serve.patch(model, backend="torch", batch_sizes=(2,))
    assert not report.unpatched and len(calls) == 5
    assert all(s.source == "fallback" and "did not build" in s.source_note for s in report.sites)
    assert "codegen does not cover" in str(report)
    mirage_serve.unpatch(model)


def test_searched_graph_that_fails_to_run_falls_back_to_the_program(monkeypatch):
    calls: list = []
    _fake_search(monkeypatch, calls)
    from mirage_serve import backends

    real = backends.build

    def crash_searched(graph, backend, device, *args, **kwargs):
        ex = real(graph, backend, device, *args, **kwargs)
        if not graph.name.endswith("_searched"):
            return ex

        def run(*ts):
            raise RuntimeError("out of resource: shared memory")
        return backends.Executor(run, ex.backend, ex.differentiable, ex.compiled, ex.seconds)

    monkeypatch.setattr(backends, "build", crash_searched)
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    ids = torch.tensor([[7], [3]])
    with torch.no_grad():
        ref = model(ids).logits
    report = mirage_serve.patch(model, backend="torch", batch_sizes=(2,))
    assert not report.unpatched and len(calls) == 5, str(report)
    assert all(s.source == "fallback" and "failed to run" in s.source_note for s in report.sites)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-5)
    mirage_serve.unpatch(model)


def test_search_that_ranks_nothing_falls_back(monkeypatch):
    class Empty:
        ranked: list = []

        @property
        def best(self):  # like SearchResult.best on an empty ranking
            return self.ranked[0][0]

    mod = types.ModuleType("superopt.search")
    mod.SearchBudget = SearchBudget  # the real budget: only the search itself is faked
    mod.superoptimize = lambda program, budget=None, arch=None: Empty()
    monkeypatch.setitem(sys.modules, "superopt.search", mod)
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=1,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    report = mirage_serve.patch(model, backend="torch", batch_sizes=(2,))
    assert not report.unpatched
    assert all(s.source == "fallback" and s.source_note == "search found no μGraph" for s in report.sites)
    mirage_serve.unpatch(model)


def test_each_program_is_traced_once_for_all_buckets(monkeypatch):
    """The other buckets' programs are re-typed from the first trace (superopt.lax.rows), not traced."""
    from mirage_serve.patching import prepare

    traced = []
    real = prepare.extract
    monkeypatch.setattr(prepare, "extract", lambda mod, args, name: traced.append(name) or real(mod, args, name))
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    ids = torch.tensor([[7, 3, 5]])
    with torch.no_grad():
        ref = model(ids).logits
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(1, 2, 3))
    assert not report.unpatched, str(report)
    # one trace per program part of the first layer's sites, at the largest bucket (the two norm sites,
    # one program: the second reads the first one's record, cache/programs.py), and the output projection's,
    # traced to look its entries up (PatchOptions.lm_head "cached": none here, so it stays original)
    assert sorted(traced) == sorted(f"{n}_m3" for n in ("attn_in", "attn_out", "mlp_in", "mlp_out",
                                                          "norm", "lm_head")), traced
    assert report.programs == 5 * 3
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-5)  # 3 rows: bucket 3
        torch.testing.assert_close(model(ids[:, :1]).logits, ref[:, :1], rtol=1e-4, atol=1e-5)  # bucket 1


def test_foreign_entries_are_verified_all_at_once_and_a_forged_one_rejected(monkeypatch, tmp_path):
    """Entries this user did not sign (another user's secret here, as shipped or imported ones) are
    verified on first use; patch() starts every such check in the pool before preparing any site
    (``Preparer.prefetch``), and a μGraph forged with its hashes right is still rejected."""
    from mirage_serve import optimize, verify_parallel
    from mirage_serve.cache import KernelCache
    from mirage_serve.cache.entry import write_entry

    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    mirage_serve.unpatch(model)
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_KEY", str(tmp_path.parent / f"{tmp_path.name}-other-key"))
    cache = KernelCache(tmp_path, shipped_dir=False)   # under a new secret: every entry is foreign
    forged = 0
    for info in cache.ls(("user",)):
        entry = cache.get(info.key, count=False)
        assert not entry.signed
        if "value=1e-06" in entry.ugraph_text:   # the norm's eps, off by 0.1%: every hash recomputed
            bad = dataclasses.replace(entry, ugraph_text=entry.ugraph_text.replace("value=1e-06", "value=1.001e-06"))
            d = tmp_path / info.key.dirname()
            for f in d.iterdir():
                f.unlink()
            write_entry(d, info.key, bad)
            forged += 1
    assert 0 < forged < 5

    events = []
    real_pending, real_verify = verify_parallel._Pending, optimize.verify

    class Pending(real_pending):
        def __init__(self, program, candidate, compile_job=None):
            events.append("submitted")
            super().__init__(program, candidate, compile_job)

    monkeypatch.setattr(verify_parallel, "_Pending", Pending)
    monkeypatch.setattr(verify_parallel, "MIN_ELEMENTS", 0)   # every check in the pool, as at model size
    monkeypatch.setattr(optimize, "verify", lambda p, g: events.append("collected") or real_verify(p, g))
    with pytest.warns(CacheWarning, match="rejected: it failed verification"):
        again = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,))
    assert not again.unpatched, str(again)
    assert events[:5] == ["submitted"] * 5 and "collected" in events   # all five before any site waits
    assert again.cache_hits == 5 - forged and again.searches == forged
    assert all(s.verdict.startswith("equivalent") for s in again.sites)
    bounds = [float(s.verdict.split("error bound ")[1].split(",")[0]) for s in again.sites]
    assert max(bounds) <= verify_parallel.TARGET_BOUND
    assert not verify_parallel._pending
