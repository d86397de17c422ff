"""The graphed decode loop with real CUDA-graph capture: HF's tokens, one capture, then replays (GPU only)."""
from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

from mirage_serve.decode import install_decode_graphs, uninstall_decode_graphs
from mirage_serve.decode.cache_pool import LENGTH_QUANTUM
from mirage_serve.hf_names import CACHE_KWARG

from .test_fast_loop import _tiny
from .test_runner import _left_padded

STEPS = 64


def _cuda_batch(model, lengths, seed=1):
    return tuple(t.to("cuda") for t in _left_padded(len(lengths), lengths, model.config.vocab_size, seed))


def _hf_static(model, ids, mask, **kw):
    """HF's own loop over a static cache as long as the runner's (same attention math in bf16), no compile."""
    length = -(-(ids.shape[1] + kw["max_new_tokens"]) // LENGTH_QUANTUM) * LENGTH_QUANTUM
    cache = StaticCache(config=model.config, max_cache_len=length)
    return model.generate(input_ids=ids, attention_mask=mask, disable_compile=True,
                          **{CACHE_KWARG: cache}, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_captured_loop_gives_hf_greedy_tokens_and_replays(lengths):
    model = _tiny("llama", dtype=torch.bfloat16).to("cuda")
    ids, mask = _cuda_batch(model, lengths)
    other_ids, other_mask = _cuda_batch(model, [n + 2 for n in lengths], seed=2)
    # min_new_tokens = max: no EOS stop, so the number of decode steps is known
    kw = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    want = _hf_static(model, ids, mask, **kw)
    want_other = _hf_static(model, other_ids, other_mask, **kw)
    runner = install_decode_graphs(model)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    got_other = model.generate(input_ids=other_ids, attention_mask=other_mask, **kw)
    again = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert runner.paths["fast"] == 3 and runner.paths["hf"] == 0
    (loop,) = runner.loops.values()
    # steps 2..64 per call: the first is run eagerly and captured, all later ones replay
    assert loop.capture_error is None
    assert loop.captures == 1 and loop.replays == 3 * (STEPS - 1) - 1
    # the replayed steps read the embedding rows the greedy kernels wrote, not HF's preparation (step_inputs)
    assert loop._direct["inputs_embeds"] is loop.embeds and loop._direct["input_ids"] is None
    assert loop.rotary_rows is not None  # and the rotary rows they wrote
    assert torch.equal(got, want) and torch.equal(again, want) and torch.equal(got_other, want_other)
    uninstall_decode_graphs(model)


@pytest.mark.gpu
def test_captured_loop_samples_hf_tokens_with_a_fixed_seed():
    model = _tiny("llama", dtype=torch.bfloat16).to("cuda")
    ids, mask = _cuda_batch(model, [5, 9, 3])
    kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=True, temperature=0.8, top_k=40,
              top_p=0.9, pad_token_id=0)
    torch.manual_seed(11)
    want = _hf_static(model, ids, mask, **kw)
    runner = install_decode_graphs(model)
    got = []
    for _ in range(2):  # the second call replays the captured sampling ops
        torch.manual_seed(11)
        got.append(model.generate(input_ids=ids, attention_mask=mask, **kw))
    (loop,) = runner.loops.values()
    assert loop.capture_error is None and loop.captures == 1 and loop.replays > 0
    assert torch.equal(got[0], want) and torch.equal(got[1], want)
    uninstall_decode_graphs(model)


@pytest.mark.gpu
def test_captured_loop_stops_at_eos_like_hf():
    model = _tiny("llama", dtype=torch.bfloat16).to("cuda")
    ids, mask = _cuda_batch(model, [5, 9, 3])
    seen = _hf_static(model, ids, mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
                      eos_token_id=None)[:, ids.shape[1]:]
    kw = dict(max_new_tokens=STEPS, do_sample=False, pad_token_id=0, eos_token_id=int(seen[0, 3]))
    want = _hf_static(model, ids, mask, **kw)
    runner = install_decode_graphs(model)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert runner.paths["fast"] == 1, runner.paths
    assert torch.equal(got, want)
    uninstall_decode_graphs(model)


def _sliding_window_runs(window: int, kind: str = "gemma2", attention: str = "hand-written"):
    """A tiny float32 Gemma with ``window``, patched (its sliding layers on the decode-attention kernels,
    which a replayed step needs: ``window_layers``): HF's static-cache tokens, then the graphed loop's twice
    (the second call replays the first's graph)."""
    import mirage_serve
    from mirage_serve.decode.attention_fast import attention_verdicts
    from mirage_serve.decode.runner import _ATTR
    from mirage_serve.options import PatchOptions

    from .test_window_layers import tiny

    model = tiny(kind, window=window).to("cuda")  # float32: a difference from HF is a bug, not rounding
    ids, mask = _cuda_batch(model, [5, 9, 3])
    kw = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    want = _hf_static(model, ids, mask, **kw)
    mirage_serve.patch(model, search_budget=0, batch_sizes=(1, 4), options=PatchOptions(attention=attention))
    runner = getattr(model, _ATTR)
    got = [model.generate(input_ids=ids, attention_mask=mask, **kw) for _ in range(2)]
    assert set(attention_verdicts(model).values()) == {"ok"}, attention_verdicts(model)
    (loop,) = runner.loops.values()
    return model, want, got, runner, loop


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["hand-written", "searched"])
@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_captured_loop_on_a_sliding_window_cache_gives_hf_tokens_and_host_lengths(kind, attention):
    # HF bounds a sliding layer's mask by the layer's host length, frozen at the capture; the kernels lift
    # that bound (window_layers.lift_causal_bound: without it the tiny Gemma-3 here parts from HF), and the
    # searched program's mask bounds it again at the device position (attention_searched.additive_mask)
    import mirage_serve
    from mirage_serve.decode import window_layers
    from mirage_serve.decode.attention_fast import attention_kernels

    model, want, (got, again), runner, loop = _sliding_window_runs(128, kind, attention)
    assert {w.split(":")[0] for w in attention_kernels(model).values()} == {attention}, attention_kernels(model)
    assert runner.paths["fast"] == 2 and runner.paths["hf"] == 0, runner.paths
    assert loop.capture_error is None and loop.captures == 1 and loop.replays == 2 * (STEPS - 1) - 1
    assert torch.equal(got, want) and torch.equal(again, want)
    layers = loop.sliding
    assert layers and all(layer.cumulative_length_int == int(layer.cumulative_length) for layer in layers)
    assert window_layers.why_not_graphable(loop.cache, 9 + STEPS) is None
    mirage_serve.unpatch(model)


@pytest.mark.gpu
def test_captured_loop_past_a_full_window_replays_then_runs_eagerly_with_hf_tokens():
    import mirage_serve

    model, want, (got, again), runner, loop = _sliding_window_runs(32)
    assert runner.paths["fast"] == 2, runner.paths
    # 9 prompt tokens + 64: the window of 32 fills at step 23; steps 2..22 replay, the rest run eagerly
    assert loop.capture_error is None and loop.captures == 1 and 0 < loop.replays < 2 * (STEPS - 1)
    assert torch.equal(got, want) and torch.equal(again, want)
    # HF stops the device length at the window (its full branch rolls instead); the host length counts
    # every token written: 9 prompt tokens, then STEPS - 1 decode steps (the last token is not fed back)
    lengths = {(layer.cumulative_length_int, int(layer.cumulative_length)) for layer in loop.sliding}
    assert lengths == {(9 + STEPS - 1, 32)}, lengths
    mirage_serve.unpatch(model)


@pytest.mark.gpu
def test_sliding_layers_on_hf_attention_run_eagerly_with_hf_tokens():
    # HF's attention on a sliding layer would read, in every replay, the mask a capture froze: no capture
    from .test_window_layers import tiny

    model = tiny("gemma3", window=128).to("cuda")
    ids, mask = _cuda_batch(model, [5, 9, 3])
    kw = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    want = _hf_static(model, ids, mask, **kw)
    runner = install_decode_graphs(model)
    got = model.generate(input_ids=ids, attention_mask=mask, **kw)
    (loop,) = runner.loops.values()
    assert loop.captures == 0 and loop.replays == 0 and "keep HF's attention" in loop.capture_error
    assert runner.paths["fast"] == 1 and torch.equal(got, want)
    uninstall_decode_graphs(model)
