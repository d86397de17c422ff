"""The decode runner on HF's loop (fast loop off): owned static caches + graphed steps give HF's tokens."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mirage_serve.decode import DecodeRunner, install_decode_graphs, uninstall_decode_graphs
from mirage_serve.hf_names import cache_of


def _tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def _left_padded(batch, lengths, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask[b, width - n:] = 1
    return ids, mask


@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_greedy_tokens_match_hf_for_16_steps(lengths):
    model = _tiny_llama()
    ids, mask = _left_padded(len(lengths), lengths, model.config.vocab_size)
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    runner = install_decode_graphs(model, capture=False, fast_loop=False)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert runner.captures == 1 and runner.replays == 14  # step 1 is prefill, step 2 captures
    assert torch.equal(got, want)
    uninstall_decode_graphs(model)
    assert "forward" not in model.__dict__ and "generate" not in model.__dict__


def test_repeated_calls_reuse_cache_and_graphs_and_regrow():
    model = _tiny_llama()
    runner = DecodeRunner.install(model, capture=False, fast_loop=False)
    ids, mask = _left_padded(2, [6, 4], model.config.vocab_size)
    kw = dict(do_sample=False, pad_token_id=0)
    a = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **kw)
    b = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **kw)
    assert torch.equal(a, b) and runner.captures == 1
    # A request longer than the cache grows it (a new cache, new graphs), still exact.
    long = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=300, min_new_tokens=300, **kw)
    DecodeRunner.uninstall(model)
    want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=300, min_new_tokens=300, **kw)
    assert torch.equal(long, want)


def test_sampling_with_seed_matches():
    model = _tiny_llama()
    ids, mask = _left_padded(3, [4, 4, 4], model.config.vocab_size)
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=True, top_k=20, pad_token_id=0)
    torch.manual_seed(5)
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    install_decode_graphs(model, capture=False, fast_loop=False)
    torch.manual_seed(5)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(got, want)


def test_double_install_is_refused():
    model = _tiny_llama()
    install_decode_graphs(model, capture=False)
    with pytest.raises(RuntimeError, match="already installed"):
        install_decode_graphs(model, capture=False)


def test_graphs_of_a_replaced_cache_are_dropped():
    model = _tiny_llama()
    runner = DecodeRunner.install(model, capture=False, fast_loop=False)
    ids, mask = _left_padded(1, [5], model.config.vocab_size)
    kw = dict(do_sample=False, pad_token_id=0)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, **kw)
    assert len(runner.steps) == 1
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=400, min_new_tokens=400, **kw)
    assert len(runner.steps) == 1  # only the step on the new, longer cache
    assert all(runner.pool.owns(cache_of(s.static_in)) for s in runner.steps.values())


def test_runner_on_a_patched_model_keeps_hf_tokens():
    """Patched sites (torch backend) + owned static cache + graphed steps: the tokens of plain HF."""
    import mirage_serve

    model = _tiny_llama()
    ids, mask = _left_padded(3, [6, 2, 5], model.config.vocab_size)
    kw = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(3,))
    assert len(report.patched) == len(report.sites) > 0
    runner = install_decode_graphs(model, capture=False, fast_loop=False)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert runner.replays == 8 and torch.equal(got, want)
    uninstall_decode_graphs(model)
    mirage_serve.unpatch(model)
