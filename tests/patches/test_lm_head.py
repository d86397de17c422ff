"""The model's output projection as a site of its own (mirage_serve.patching.lm_head): found through HF's
interface and checked from the data flow, its logits equal to the original's, greedy tokens unchanged; by default
run only at the buckets the kernel cache holds (never searched), left alone when off and after unpatch()."""
import pytest
import torch
from transformers import Gemma2Config, LlamaConfig, Qwen2Config

import mirage_serve
from mirage_serve import knobs
from mirage_serve.options import PatchOptions
from mirage_serve.patching import prepare
from mirage_serve.patching.lm_head import find_lm_head

from .parity import build
from .test_patch_cache import _fake_search

LLAMA = LlamaConfig(vocab_size=61, hidden_size=37, intermediate_size=53, num_hidden_layers=2,
                    num_attention_heads=1, num_key_value_heads=1, head_dim=12)
QWEN2_TIED = Qwen2Config(vocab_size=67, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
GEMMA2 = Gemma2Config(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, final_logit_softcapping=3.0)
ON = PatchOptions(lm_head="search")


@pytest.mark.parametrize("cfg", [LLAMA, QWEN2_TIED, GEMMA2], ids=lambda c: c.model_type)
def test_found_through_hf_and_the_data_flow(cfg):
    model = build(cfg)
    assert find_lm_head(model) == "lm_head"
    # what HF names is checked: a Linear whose output is not as wide as the logits, one never called, none
    model.get_output_embeddings = lambda: model.model.layers[0].mlp.down_proj
    assert find_lm_head(model) is None
    model.spare = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    model.get_output_embeddings = lambda: model.spare
    assert find_lm_head(model) is None
    model.get_output_embeddings = lambda: None
    assert find_lm_head(model) is None


@pytest.mark.parametrize("cfg", [LLAMA, QWEN2_TIED, GEMMA2], ids=lambda c: c.model_type)
def test_patched_logits_and_greedy_tokens_match(cfg):
    model = build(cfg)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, cfg.vocab_size, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row
    kw = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want_logits = model(ids, attention_mask=mask).logits
        want = model.generate(ids, **kw)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,), options=ON)
    head, = [s for s in report.sites if s.site == "lm_head"]
    assert head.patched and head.modules == ("lm_head",), str(report)
    with torch.no_grad():
        got_logits = model(ids, attention_mask=mask).logits
        got = model.generate(ids, **kw)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-5)
    assert torch.equal(got, want)
    if cfg.tie_word_embeddings:  # the projection still reads the embedding's own storage
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_the_kernel_runs_on_a_decode_row(monkeypatch):
    """Two rows of one token (a decode step's shape, within the bucket): the site's kernel gives the logits."""
    model = build(LLAMA)
    x = torch.randn(2, 1, 37, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model.lm_head(x)
    mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,), options=ON)
    runs = []
    real = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, *a: runs.append(1) or real(self, *a))
    with torch.no_grad():
        got = model.lm_head(x)
    assert runs, "the original forward ran, not the site's kernel"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_off_and_unpatched():
    model = build(LLAMA)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,),
                                options=PatchOptions(lm_head="off"))
    assert not [s for s in report.sites if s.site == "lm_head"] and "forward" not in model.lm_head.__dict__
    mirage_serve.unpatch(model)
    mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,), options=ON)
    assert "forward" in model.lm_head.__dict__
    mirage_serve.unpatch(model)
    assert "forward" not in model.lm_head.__dict__


def test_by_default_it_runs_only_where_the_cache_holds_it(monkeypatch, tmp_path):
    """"cached", the default: no entry, no site and no search (a note says how to get one); once a "search" patch
    stored the bucket-2 kernel, a default patch over buckets 1, 2, 4 runs it from the cache for up to 2 rows,
    searching nothing for it, and 3 rows run the original projection."""
    calls: list = []
    _fake_search(monkeypatch, calls)
    model = build(LLAMA)
    cached = PatchOptions(lm_head="cached")
    first = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,), options=cached)
    assert not [s for s in first.sites if s.site == "lm_head"] and "forward" not in model.lm_head.__dict__
    assert "lm_head: cuBLAS (the kernel cache holds no kernel" in first.note and "MIRAGE_SERVE_LM_HEAD=search" in first.note
    assert not [c for c in calls if "lm_head" in c[0]]
    mirage_serve.unpatch(model)

    mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(2,), options=ON)
    assert len([c for c in calls if "lm_head" in c[0]]) == 1
    mirage_serve.unpatch(model)

    searched = len(calls)
    third = mirage_serve.patch(model, backend="torch", cache_dir=tmp_path, batch_sizes=(1, 2, 4), options=cached)
    head, = [s for s in third.sites if s.site == "lm_head"]
    assert head.patched and head.source == "cache", str(third)
    assert not [c for c in calls[searched:] if "lm_head" in c[0]]
    assert "lm_head: a site kernel up to 2 rows, cuBLAS above" in third.note
    runs = []
    real = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, *a: runs.append(len(a[0])) or real(self, *a))
    g = torch.Generator().manual_seed(3)
    for rows in (1, 2, 3):
        x = torch.randn(rows, 37, generator=g)
        runs.clear()
        with torch.no_grad():
            got = model.lm_head(x)
            want = torch.nn.functional.linear(x, model.lm_head.weight)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert bool(runs) == (rows <= 2), (rows, runs)


def test_the_choice_is_checked():
    with pytest.raises(ValueError, match="lm_head must be one of"):
        PatchOptions(lm_head=True)
    assert knobs.parse_lm_head("1") == "search" and knobs.parse_lm_head("Off") == "off"
    assert knobs.parse_lm_head(" cached ") == "cached"
    with pytest.raises(ValueError, match="cached"):
        knobs.parse_lm_head("sometimes")
