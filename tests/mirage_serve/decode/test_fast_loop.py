"""The graphed decode loop (CPU: eager stand-in through the same buffers) returns HF generate()'s tokens."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from mirage_serve.decode import decode_paths, install_decode_graphs, uninstall_decode_graphs
from mirage_serve.decode.token_choice import TokenChooser

from .test_runner import _left_padded

_SHAPE = dict(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
              num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512)


def _tiny(family: str, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                          "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    model = model_cls(cfg_cls(**_SHAPE)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.to(dtype)


def _hf_then_fast(model, calls, **install):
    """Run each (kwargs, seed) call with plain HF, then with the runner; return both lists."""
    def run_all():
        out = []
        for kw, seed in calls:
            if seed is not None:
                torch.manual_seed(seed)
            out.append(model.generate(**kw))
        return out
    want = run_all()
    runner = install_decode_graphs(model, capture=False, **install)
    got = run_all()
    return want, got, runner


def _eos_candidates(model, ids, mask, n=24):
    """Tokens greedy decoding actually produces, by (row, step): EOS ids that stop rows early."""
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_greedy_tokens_match_hf_for_24_steps(family, lengths):
    model = _tiny(family)
    ids, mask = _left_padded(len(lengths), lengths, model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    (want,), (got,), runner = _hf_then_fast(model, [(kw, None)])
    assert runner.paths["fast"] == 1 and runner.paths["hf"] == 0
    assert got.shape == (len(lengths), max(lengths) + 24) and torch.equal(got, want)
    # HF's mask of the first step was ours in every element, so the later steps passed ours (step_mask)
    assert [loop.step_mask.adopted for loop in runner.loops.values()] == [True]
    # and HF's preparation held only the loop's buffers, so the later steps passed the ids buffer itself
    # (step_inputs; no embedding rows: the greedy kernels that write them run on a GPU or in Triton's interpreter)
    (loop,) = runner.loops.values()
    assert loop._direct is not None and loop._direct["input_ids"] is loop.ids and loop.embeds is None
    uninstall_decode_graphs(model)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("sampling", [dict(top_k=20), dict(temperature=0.7, top_p=0.9),
                                      dict(temperature=1.3, top_k=11, top_p=0.8)])
def test_sampling_with_a_fixed_seed_matches_hf(family, sampling):
    model = _tiny(family)
    ids, mask = _left_padded(3, [4, 8, 6], model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=True, pad_token_id=0,
              eos_token_id=None, **sampling)
    want, got, runner = _hf_then_fast(model, [(kw, 5), (kw, 6)])
    assert runner.paths["fast"] == 2
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(want[0], want[1])  # the seed matters: the test would see a wrong stream


def test_sampling_op_is_torch_multinomial():
    """argmax(p / Exp(1)) consumes the same random stream as torch.multinomial(p, 1)."""
    logits = torch.randn(5, 73, generator=torch.Generator().manual_seed(0)) * 3
    chooser = TokenChooser((), do_sample=True)
    zero, no_eos = torch.zeros((), dtype=torch.long), torch.zeros(73, dtype=torch.bool)
    for seed in range(4):
        torch.manual_seed(seed)
        want = torch.multinomial(torch.softmax(logits, -1), num_samples=1).squeeze(1)
        torch.manual_seed(seed)
        assert torch.equal(chooser(logits, zero, zero, no_eos), want)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eos_mid_sequence_pads_finished_rows_like_hf(family):
    model = _tiny(family)
    ids, mask = _left_padded(3, [5, 9, 3], model.config.vocab_size)
    seen = _eos_candidates(model, ids, mask)
    eos = int(seen[0, 4])  # row 0 stops by step 5; others stop when (if) they produce it
    other = int(seen[2, 7])
    calls = [(dict(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                   pad_token_id=0, eos_token_id=e), None) for e in (eos, [other, eos])]
    want, got, runner = _hf_then_fast(model, calls)
    assert runner.paths["fast"] == 2
    for w, g in zip(want, got):
        assert torch.equal(g, w)
    new = want[0][:, ids.shape[1]:]
    first = (new[0] == eos).nonzero()[0, 0]
    assert first <= 4 and (new[0, first + 1:] == 0).all() and new.shape[1] > first + 1  # padded


def test_generation_stops_when_all_rows_finished():
    """A long request whose rows all hit EOS early stops early (polled) and returns HF's length."""
    model = _tiny("llama")
    ids, mask = _left_padded(1, [6], model.config.vocab_size)
    eos = int(_eos_candidates(model, ids, mask)[0, 2])
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=200, do_sample=False, pad_token_id=0,
              eos_token_id=eos)
    (want,), (got,), runner = _hf_then_fast(model, [(kw, None)])
    assert want.shape[1] < ids.shape[1] + 10 and torch.equal(got, want)
    (loop,) = runner.loops.values()
    assert int(loop.t) <= 2 * 16 + 1  # stopped at the second poll, not after 200 steps


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_min_new_tokens_and_min_length_are_honoured(family):
    model = _tiny(family)
    ids, mask = _left_padded(3, [5, 9, 3], model.config.vocab_size)
    eos = int(_eos_candidates(model, ids, mask)[0, 1])
    base = dict(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                eos_token_id=eos)
    calls = [(dict(base, min_new_tokens=10), None), (dict(base, min_length=ids.shape[1] + 7), None),
             (dict(base, min_new_tokens=6, do_sample=True, top_k=30), 3)]
    want, got, runner = _hf_then_fast(model, calls)
    assert runner.paths["fast"] == 3
    for w, g in zip(want, got):
        assert torch.equal(g, w)
    assert not (want[0][:, ids.shape[1]:ids.shape[1] + 10] == eos).any()


def test_repeated_calls_with_other_prompt_lengths_reuse_the_loop():
    model = _tiny("qwen2")
    calls = []
    for seed, lengths in enumerate([[5, 9, 3], [12, 2, 7], [4, 4, 4]]):
        ids, mask = _left_padded(3, lengths, model.config.vocab_size, seed=seed + 1)
        calls.append((dict(input_ids=ids, attention_mask=mask, max_new_tokens=16 + seed,
                           do_sample=False, pad_token_id=0, eos_token_id=None), None))
    want, got, runner = _hf_then_fast(model, calls)
    assert runner.paths["fast"] == 3 and len(runner.loops) == 1  # one cache, one signature
    for w, g in zip(want, got):
        assert torch.equal(g, w)


@pytest.mark.parametrize("extra, reason", [
    (dict(output_scores=True, return_dict_in_generate=True), "hf: return_dict_in_generate"),
    (dict(repetition_penalty=1.3), "hf: logits processor RepetitionPenaltyLogitsProcessor"),
    (dict(num_beams=2), "hf: beams"),
])
def test_unsupported_calls_take_hf_loop_and_still_match(extra, reason):
    model = _tiny("llama")
    ids, mask = _left_padded(3, [5, 9, 3], model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
              eos_token_id=None, **extra)
    (want,), (got,), runner = _hf_then_fast(model, [(kw, None)])
    assert runner.paths["fast"] == 0 and runner.paths["hf"] == 1 and runner.paths[reason] == 1
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
    else:
        assert torch.equal(got.sequences, want.sequences)


def test_fast_loop_over_a_patched_model_keeps_hf_tokens():
    """Patched sites (torch backend) + owned static cache + the graphed loop: the tokens of plain HF."""
    import mirage_serve

    model = _tiny("llama")
    ids, mask = _left_padded(3, [6, 2, 5], model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    want = model.generate(**kw)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(3,))
    assert len(report.patched) == len(report.sites) > 0
    runner = install_decode_graphs(model, capture=False)
    got = model.generate(**kw)
    assert decode_paths(model) == {"fast": 1} and torch.equal(got, want)
    uninstall_decode_graphs(model)
    assert decode_paths(model) == {}
    mirage_serve.unpatch(model)


def test_calls_in_and_out_of_inference_mode_mix():
    """A first call under inference_mode leaves inference-tensor caches; a later plain call still works."""
    model = _tiny("llama")
    ids, mask = _left_padded(3, [5, 9, 3], model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    want = model.generate(**kw)
    runner = install_decode_graphs(model, capture=False)
    with torch.inference_mode():
        first = model.generate(**kw)
    second = model.generate(**kw)
    with torch.inference_mode():
        third = model.generate(**kw)
    assert runner.paths["fast"] == 3
    for got in (first, second, third):
        assert torch.equal(got, want)
