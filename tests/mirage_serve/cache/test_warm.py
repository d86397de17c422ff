"""warm_model: config resolution, model construction, and the plumbing into patch()."""
from __future__ import annotations

import json

import pytest

from mirage_serve.patching import pipeline
from mirage_serve.cache import CacheEntry, CacheKey, KernelCache, versions_now
from mirage_serve.cache.warm import build_model, resolve_config, warm_model
from mirage_serve.registry import UnknownModelError

from ._helpers import TINY

def test_resolve_config_from_every_kind_of_argument(tmp_path):
    name, cfg = resolve_config("smollm2-135m")               # registry, case-insensitive
    assert name == "SmolLM2-135M" and cfg.model_type == "llama" and cfg.hidden_size == 576
    assert resolve_config("HuggingFaceTB/SmolLM2-135M")[0] == "SmolLM2-135M"   # hub id
    name, cfg = resolve_config(TINY)
    assert name == "llama" and cfg.intermediate_size == 136
    name, cfg = resolve_config({"name": "Tiny", "hub_id": "x/y", "config": TINY})
    assert name == "Tiny" and cfg.num_key_value_heads == 2
    (tmp_path / "mymodel").mkdir()
    (tmp_path / "mymodel" / "config.json").write_text(json.dumps(TINY))
    name, cfg = resolve_config(tmp_path / "mymodel")
    assert name == "mymodel" and cfg.vocab_size == 73
    assert resolve_config(cfg)[1] is cfg
    with pytest.raises(UnknownModelError, match="closest"):
        resolve_config("Llama-3.2-1")
    with pytest.raises(TypeError):
        resolve_config(42)


def test_build_model_has_random_finite_weights():
    import torch

    model = build_model(resolve_config(TINY)[1], "fp32", "cpu")
    w = model.model.layers[1].mlp.down_proj.weight           # [96, 136]
    assert w.shape == (96, 136) and w.dtype == torch.float32 and not model.training
    assert torch.isfinite(w).all() and 0.015 < w.std().item() < 0.025
    assert build_model(resolve_config(TINY)[1], "bf16", "cpu").lm_head.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        build_model(resolve_config(TINY)[1], "int8", "cpu")


def _fake_patch(calls):
    """Stands in for patch(): one cache entry per (distinct Linear shape, batch bucket)."""
    import torch

    def patch(model, *, cache_dir, batch_sizes, backend="torch", progress=None, options=None):
        calls.append({"cache_dir": cache_dir, "batch_sizes": batch_sizes, "backend": backend,
                      "layers": len(model.model.layers), "lm_head": options.lm_head})
        cache = KernelCache(cache_dir, shipped_dir=False)
        shapes = sorted({tuple(m.weight.shape) for m in model.modules()
                         if isinstance(m, torch.nn.Linear)})
        sites = [(s, b) for s in shapes for b in batch_sizes]
        for n, (shape, b) in enumerate(sites):
            key = CacheKey(f"linear{shape}", f"b{b}", "fp32", "cpu", backend, versions_now(),
                           f"linear-n{shape[0]}-k{shape[1]}")
            with cache.lock(key):
                if cache.get(key) is None:
                    cache.put(key, CacheEntry(f"graph linear{shape}\n", {"kernel.py": "pass\n"}, {},
                                              {"batch": b}))
            if progress:
                progress(f"site {shape} b{b}", n + 1, len(sites))
        return {"sites": len(sites)}
    return patch


def test_warm_model_drives_patch_and_counts_entries(tmp_path, monkeypatch):
    monkeypatch.delenv("MIRAGE_SERVE_LM_HEAD", raising=False)
    calls, seen = [], []
    monkeypatch.setattr(pipeline, "patch", _fake_patch(calls))
    r = warm_model(TINY, batch_sizes=[8, 3, 3, 1], dtype="fp32", cache_dir=tmp_path / "c",
                   progress=lambda msg, done, total: seen.append((msg, done, total)),
                   backend="torch", device="cpu", num_layers=1)
    # warming searches the output projection too, which a patch() takes only from the cache by default
    assert calls == [{"cache_dir": tmp_path / "c", "batch_sizes": (1, 3, 8), "backend": "torch",
                      "layers": 1, "lm_head": "search"}]
    # Linear shapes: q [96,96], k/v [48,96], o [96,96], gate/up [136,96], down [96,136], lm_head [73,96].
    assert r.report == {"sites": 15} and (r.entries_before, r.entries_after) == (0, 15)
    assert r.batch_sizes == (1, 3, 8) and "15 new entries" in r.summary()
    assert seen[0] == ("resolving config", 0, 3) and seen[-1][1:] == (3, 3)
    assert not any(m.startswith("site") for m, _, _ in seen)  # patch() reports sites in its report, not here
    again = warm_model(TINY, batch_sizes=[1, 3, 8], dtype="fp32", cache_dir=tmp_path / "c",
                       backend="torch", device="cpu", num_layers=1)
    assert (again.entries_before, again.entries_after) == (15, 15)
    monkeypatch.setenv("MIRAGE_SERVE_LM_HEAD", "off")  # set, the knob still decides
    warm_model(TINY, batch_sizes=[1], dtype="fp32", cache_dir=tmp_path / "c", backend="torch", device="cpu",
               num_layers=1)
    assert calls[-1]["lm_head"] == "off"
    with pytest.raises(ValueError):
        warm_model(TINY, batch_sizes=[0], cache_dir=tmp_path / "c")


@pytest.mark.slow
def test_warm_with_the_real_patch_fills_the_cache_then_hits(tmp_path):
    import torch

    backend = "auto" if torch.cuda.is_available() else "torch"
    first = warm_model(TINY, batch_sizes=[3], dtype="fp32", cache_dir=tmp_path / "c",
                       backend=backend, num_layers=1)
    assert first.report.programs > 0, first.report
    assert first.entries_after > first.entries_before == 0
    assert first.report.searches == first.entries_after      # every winner stored, once
    second = warm_model(TINY, batch_sizes=[3], dtype="fp32", cache_dir=tmp_path / "c",
                        backend=backend, num_layers=1)
    assert second.entries_after == first.entries_after
    assert second.report.searches == 0 and second.report.cache_hits == first.report.searches
    # the summary says where the programs came from (hits are not new entries) and what stayed original
    assert "0 new entries" in second.summary() and second.report.counts() in second.summary()
    assert "not patched" not in second.summary()


def test_cache_lengths_become_the_capacities_generate_allocates():
    from mirage_serve.cache.warm import cache_capacities

    assert cache_capacities([384, 256, 4000, 4096, 3]) == (256, 512, 4096)  # rounded up to 256, as cache_pool does
    with pytest.raises(ValueError, match="at least 3"):
        cache_capacities([2])


def test_choose_attention_fills_each_cache_with_one_short_generate(monkeypatch):
    import torch

    from mirage_serve.cache import warm
    from mirage_serve.decode import attention_fast

    model = build_model(resolve_config(TINY)[1], "fp32", "cpu")
    # on a CPU there is no decode attention to choose: each shape says so, nothing runs
    assert warm.choose_attention(model, (1,), (256,), lambda *a: None) == {
        "batch 1, cache 256": "not chosen: decode attention runs on a GPU"}

    calls = []
    real_generate = model.generate

    def generate(ids, **kw):  # recorded, and run (HF's own decode steps on the CPU)
        calls.append((tuple(ids.shape), kw["max_new_tokens"], kw["min_new_tokens"]))
        return real_generate(ids, **kw)

    monkeypatch.setattr(model, "generate", generate)
    monkeypatch.setattr(attention_fast, "attention_kernels", lambda m: {"layers.0.self_attn": "hand-written: x"})
    notes = []
    got = warm.choose_attention(model, (1, 4), (256, 512), lambda msg, i, n: notes.append((msg, i, n)), gpu=True)
    # the prompt fills the cache but for the 2 new tokens: generate() allocates exactly that capacity
    assert calls == [((1, 254), 2, 2), ((1, 510), 2, 2), ((4, 254), 2, 2), ((4, 510), 2, 2)]
    assert got == {f"batch {b}, cache {n}": "hand-written: x" for b in (1, 4) for n in (256, 512)}
    assert notes[0] == ("choosing the decode attention for batch 1, cache 256", 0, 4)


def test_warm_summary_names_sites_left_original(tmp_path):
    from mirage_serve.cache.warm import WarmResult
    from mirage_serve.report import PatchReport, SiteReport

    report = PatchReport("llama", "triton", "cuda:0", "bfloat16", (1, 8), searches=3, cache_hits=2, programs=5,
                         sites=[SiteReport(0, "attn_in", ("input_layernorm",), patched=True),
                                SiteReport(0, "mlp_in", ("mlp",), reason="extraction failed: slice")])
    text = WarmResult("m", "bf16", (1, 8), tmp_path, 1.0, 4, 7, report).summary()
    assert "3 new entries" in text and "1/2 sites patched" in text and "3 searches" in text
    assert "not patched: layer 0 mlp_in: extraction failed: slice" in text
