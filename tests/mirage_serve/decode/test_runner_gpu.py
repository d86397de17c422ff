"""The decode runner on HF's loop with real CUDA-graph capture: HF's tokens, steps replayed (GPU only)."""
from __future__ import annotations

import pytest
import torch

from mirage_serve.decode import install_decode_graphs, uninstall_decode_graphs

from .test_runner import _left_padded, _tiny_llama


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_captured_steps_give_hf_tokens(lengths):
    model = _tiny_llama().to("cuda")
    ids, mask = (t.to("cuda") for t in _left_padded(len(lengths), lengths, model.config.vocab_size))
    kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids, attention_mask=mask, **kw)
    runner = install_decode_graphs(model, fast_loop=False)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    again = model.generate(input_ids=ids, attention_mask=mask, **kw)  # replays the same graph
    assert runner.captures == 1 and runner.replays == 2 * 22 + 1
    assert torch.equal(got, want) and torch.equal(again, want)
    uninstall_decode_graphs(model)


@pytest.mark.gpu
def test_patch_installs_graphs_on_cuda_and_unpatch_removes_them():
    import mirage_serve

    model = _tiny_llama().to("cuda")
    report = mirage_serve.patch(model, search_budget=0, batch_sizes=(1,))
    assert report.cuda_graphs and "generate" in model.__dict__
    mirage_serve.unpatch(model)
    assert "generate" not in model.__dict__ and "forward" not in model.__dict__
