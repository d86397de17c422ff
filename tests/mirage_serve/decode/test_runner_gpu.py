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


@pytest.mark.gpu
def test_captured_steps_on_a_sliding_window_cache_keep_hf_logits():
    # HF's loop builds each step's masks on the host from the sliding layers' host lengths: a replay
    # that left them behind gave logits drifting to 0.2-0.3 relative error by step 12 (the CPU
    # emulation in benchmarks/window_lengths_cpu.py; Gemma-2-2B's 0.22 sampling check on the H100)
    from .test_window_layers import tiny

    model = tiny("gemma2", window=128).to("cuda")  # float32: logits comparable to 1e-4
    ids, mask = (t.to("cuda") for t in _left_padded(3, [5, 9, 3], model.config.vocab_size))
    kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True, output_logits=True)
    want = torch.stack(model.generate(input_ids=ids, attention_mask=mask, **kw).logits, 1)
    runner = install_decode_graphs(model)
    got = torch.stack(model.generate(input_ids=ids, attention_mask=mask, **kw).logits, 1)
    assert runner.captures >= 1 and runner.replays > 0, dict(runner.paths)
    err = ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
    assert err < 1e-4, err
    uninstall_decode_graphs(model)
