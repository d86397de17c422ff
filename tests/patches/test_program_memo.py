"""Extracted programs are remembered in the user cache: a warm patch() traces nothing, and a
record that is damaged, or a site whose code or structure changed, is traced again."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import LlamaConfig

import mirage_serve
from mirage_serve.patching import prepare
from mirage_serve.cache import CacheWarning
from mirage_serve.cache.programs import fingerprint

from .parity import build

CFG = dict(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=2, num_attention_heads=3,
           num_key_value_heads=1, head_dim=8)


def _counting_extract(monkeypatch) -> list:
    traced = []
    real = prepare.extract

    def extract(module, args, name="program"):
        traced.append(name)
        return real(module, args, name)
    monkeypatch.setattr(prepare, "extract", extract)
    return traced


def _patch(model, cache_dir):
    report = mirage_serve.patch(model, backend="torch", cache_dir=cache_dir, search_budget=0, batch_sizes=(1, 3))
    assert not report.unpatched, str(report)
    programs = [s.program for s in report.sites]
    mirage_serve.unpatch(model)
    return programs


def test_a_warm_patch_traces_nothing_and_finds_the_same_programs(monkeypatch, tmp_path):
    traced = _counting_extract(monkeypatch)
    model = build(LlamaConfig(**CFG))
    first = _patch(model, tmp_path)
    assert traced and len(list((tmp_path / "programs").glob("*.json"))) == len(traced)
    traced.clear()
    assert _patch(model, tmp_path) == first and traced == []
    traced.clear()
    _patch(build(LlamaConfig(**CFG)), tmp_path)  # another instance of the same architecture
    assert traced == []


def test_a_damaged_record_is_ignored_and_traced_again(monkeypatch, tmp_path):
    traced = _counting_extract(monkeypatch)
    model = build(LlamaConfig(**CFG))
    first = _patch(model, tmp_path)
    records = sorted((tmp_path / "programs").glob("*.json"))
    records[0].write_text(records[0].read_text()[:-20])             # truncated
    rec = json.loads(records[1].read_text())
    rec["body"]["text"] = rec["body"]["text"].replace("graph ", "graph edited_", 1)  # edited: hash mismatch
    records[1].write_text(json.dumps(rec))
    traced.clear()
    with pytest.warns(CacheWarning, match="ignoring program record"):
        assert _patch(model, tmp_path) == first
    assert len(traced) == 2


def test_the_fingerprint_follows_code_structure_and_shape():
    model = build(LlamaConfig(**CFG))
    layer = model.model.layers[0]
    norm = layer.input_layernorm
    base = fingerprint(norm, "norm", 4, torch.float32)
    assert fingerprint(norm, "norm", 4, torch.float32) == base
    assert fingerprint(norm, "norm", 8, torch.float32) != base
    assert fingerprint(norm, "norm", 4, torch.bfloat16) != base
    assert fingerprint(layer.post_attention_layernorm, "norm", 4, torch.float32) == base  # same structure
    norm.variance_epsilon = 1e-3
    assert fingerprint(norm, "norm", 4, torch.float32) != base

    class EditedNorm(type(norm)):   # same attributes, other code
        def forward(self, x):
            return super().forward(x) * 2

    other = EditedNorm(CFG["hidden_size"])
    other.variance_epsilon = norm.variance_epsilon = 1e-6
    assert fingerprint(other, "norm", 4, torch.float32) != fingerprint(norm, "norm", 4, torch.float32)


def test_a_forward_set_on_the_instance_changes_the_fingerprint():
    model = build(LlamaConfig(**CFG))
    norm = model.model.layers[0].input_layernorm
    base = fingerprint(norm, "norm", 4, torch.float32)

    def doubled(x):
        return type(norm).forward(norm, x) * 2

    def halved(x):
        return type(norm).forward(norm, x) / 2

    norm.forward = doubled
    with_doubled = fingerprint(norm, "norm", 4, torch.float32)
    norm.forward = halved
    assert len({base, with_doubled, fingerprint(norm, "norm", 4, torch.float32)}) == 3


def test_a_read_only_cache_stores_no_record(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_READ_ONLY", "1")
    traced = _counting_extract(monkeypatch)
    model = build(LlamaConfig(**CFG))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _patch(model, tmp_path)
    assert traced and not (tmp_path / "programs").exists()


def test_a_read_only_cache_still_serves_its_records(monkeypatch, tmp_path):
    traced = _counting_extract(monkeypatch)
    model = build(LlamaConfig(**CFG))
    first = _patch(model, tmp_path)   # writable: traces and stores
    traced.clear()
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_READ_ONLY", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _patch(model, tmp_path) == first
    assert traced == []


def test_cache_clear_removes_the_records(tmp_path):
    from mirage_serve.cache import KernelCache

    _patch(build(LlamaConfig(**CFG)), tmp_path)
    assert any((tmp_path / "programs").iterdir())
    KernelCache(tmp_path, shipped_dir=False).clear()
    assert not (tmp_path / "programs").exists()
