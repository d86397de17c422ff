"""The graphed decode loop with real CUDA-graph capture: HF's tokens, one capture, then replays (GPU only)."""
from __future__ import annotations

import pytest
import torch

from mirage_serve.decode import install_decode_graphs, uninstall_decode_graphs

from .test_fast_loop import _tiny
from .test_runner import _left_padded

STEPS = 64


def _cuda_batch(model, lengths, seed=1):
    return tuple(t.to("cuda") for t in _left_padded(len(lengths), lengths, model.config.vocab_size, seed))


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_captured_loop_gives_hf_greedy_tokens_and_replays(lengths):
    model = _tiny("llama", dtype=torch.bfloat16).to("cuda")
    ids, mask = _cuda_batch(model, lengths)
    other_ids, other_mask = _cuda_batch(model, [n + 2 for n in lengths], seed=2)
    # min_new_tokens = max: no EOS stop, so the number of decode steps is known
    kw = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    # Reference: HF's own loop on a static cache (same attention math as ours), no compile.
    ref = dict(kw, cache_implementation="static", disable_compile=True)
    want = model.generate(input_ids=ids, attention_mask=mask, **ref)
    want_other = model.generate(input_ids=other_ids, attention_mask=other_mask, **ref)
    runner = install_decode_graphs(model)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    got_other = model.generate(input_ids=other_ids, attention_mask=other_mask, **kw)
    again = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert runner.paths["fast"] == 3 and runner.paths["hf"] == 0
    (loop,) = runner.loops.values()
    # steps 2..64 per call: the first is run eagerly and captured, all later ones replay
    assert loop.captures == 1 and loop.replays == 3 * (STEPS - 1) - 1
    assert torch.equal(got, want) and torch.equal(again, want) and torch.equal(got_other, want_other)
    uninstall_decode_graphs(model)


@pytest.mark.gpu
def test_captured_loop_samples_hf_tokens_with_a_fixed_seed():
    model = _tiny("llama", dtype=torch.bfloat16).to("cuda")
    ids, mask = _cuda_batch(model, [5, 9, 3])
    kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=True, temperature=0.8, top_k=40,
              top_p=0.9, pad_token_id=0)
    ref = dict(kw, cache_implementation="static", disable_compile=True)
    torch.manual_seed(11)
    want = model.generate(input_ids=ids, attention_mask=mask, **ref)
    install_decode_graphs(model)
    got = []
    for _ in range(2):  # the second call replays the captured sampling ops
        torch.manual_seed(11)
        got.append(model.generate(input_ids=ids, attention_mask=mask, **kw))
    assert torch.equal(got[0], want) and torch.equal(got[1], want)
    uninstall_decode_graphs(model)


@pytest.mark.gpu
def test_captured_loop_stops_at_eos_like_hf():
    model = _tiny("llama", dtype=torch.bfloat16).to("cuda")
    ids, mask = _cuda_batch(model, [5, 9, 3])
    seen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                          pad_token_id=0, eos_token_id=None, cache_implementation="static",
                          disable_compile=True)[:, ids.shape[1]:]
    kw = dict(max_new_tokens=STEPS, do_sample=False, pad_token_id=0, eos_token_id=int(seen[0, 3]),
              cache_implementation="static", disable_compile=True)
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    install_decode_graphs(model)
    kw.pop("cache_implementation")
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(got, want)
    uninstall_decode_graphs(model)
