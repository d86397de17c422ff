"""Sliding-window cache layers (Gemma-2 / Gemma-3 hybrids, Phi-3's all-sliding cache) in graphed decoding.

On the CPU the loop runs its step eagerly through the same buffers; what a capture and replays do to
the layers' host lengths is checked here by hand (``window_layers.advance``), and for real in
test_fast_loop_gpu.py.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, Phi3Config, StaticCache

from mirage_serve.decode import install_decode_graphs, uninstall_decode_graphs
from mirage_serve.decode import window_layers
from mirage_serve.hf_names import CACHE_KWARG

from .test_runner import _left_padded

_SHAPE = dict(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=12, max_position_embeddings=512)


def tiny(kind: str, window: int, seed: int = 0, dtype=torch.float32):
    cfg = {"gemma2": lambda: Gemma2Config(sliding_window=window, **_SHAPE),
           "gemma3": lambda: Gemma3TextConfig(sliding_window=window, sliding_window_pattern=2, **_SHAPE),
           "phi3": lambda: Phi3Config(sliding_window=window, pad_token_id=0, **_SHAPE)}[kind]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.to(dtype)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3", "phi3"])
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
@pytest.mark.parametrize("window", [40, 12], ids=["inside", "past"])
def test_the_loop_decodes_hf_tokens_inside_and_past_the_window(kind, lengths, window):
    # past a full window the loop's steps run eagerly (HF's code rolls the window): its mask and
    # token buffers span the generation, not the window
    model = tiny(kind, window=window)
    ids, mask = _left_padded(len(lengths), lengths, model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0,
              eos_token_id=None)
    want = model.generate(**kw)
    runner = install_decode_graphs(model, capture=False)
    assert torch.equal(model.generate(**kw), want)
    assert runner.paths["fast"] == 1 and runner.paths["hf"] == 0, runner.paths
    (loop,) = runner.loops.values()
    assert loop.mask.shape[1] >= max(lengths) + 24 and loop.sliding
    if window == 40:  # never full: host and device lengths agree (a full window's update moves only the host's)
        assert all(layer.cumulative_length_int == int(layer.cumulative_length) for layer in loop.sliding)
    uninstall_decode_graphs(model)


def test_host_lengths_follow_what_replays_wrote_and_a_capture_counted():
    model = tiny("gemma2", window=8)
    cache = StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(torch.ones(1, 5, dtype=torch.long), **{CACHE_KWARG: cache})
    layers = window_layers.sliding_layers(cache)
    assert [layer.cumulative_length_int for layer in layers] == [5] * len(layers)
    assert window_layers.why_not_graphable(cache, 32) is None  # sliding layers: later steps run eagerly
    assert window_layers.why_not_graphable(cache, 33) == "cache shorter than max_length"  # a static layer
    assert window_layers.replayable(cache.layers, 3) and not window_layers.replayable(cache.layers, 4)
    window_layers.advance(cache.layers, 2)  # two replays wrote positions 5 and 6 on the device
    assert [layer.cumulative_length_int for layer in layers] == [7] * len(layers)
    assert window_layers.replayable(cache.layers, 1) and not window_layers.replayable(cache.layers, 2)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])  # a boolean mask, an additive one
def test_a_lifted_mask_from_an_earlier_step_is_the_current_steps_mask(impl):
    # HF bounds a sliding layer's decode mask by the layer's host length; a captured step keeps the
    # capture's. Lifted, that older mask must equal the current step's on every slot up to the current
    # one (left padding included), which is all the kernels read.
    from transformers.masking_utils import create_sliding_window_causal_mask

    model = tiny("gemma3", window=16)
    model.config._attn_implementation = impl
    ids, mask2d = _left_padded(3, [5, 9, 3], model.config.vocab_size)
    full = torch.cat([mask2d, torch.ones(3, 16 - mask2d.shape[1], dtype=mask2d.dtype)], dim=1)
    cache = StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(ids, attention_mask=mask2d, **{CACHE_KWARG: cache})
    layer = window_layers.sliding_layers(cache)[0]
    embeds = torch.zeros(3, 1, model.config.hidden_size)

    def hf_mask():
        at = torch.full((3, 1), layer.cumulative_length_int)
        return create_sliding_window_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=full,
                                                 **{CACHE_KWARG: cache}, position_ids=at)

    then = hf_mask()  # the mask a capture at the prompt's end would freeze
    lifted = window_layers.lift_causal_bound(then, layer)
    assert window_layers.lift_causal_bound(then, layer) is lifted  # once a step, shared by the layers
    for _ in range(4):  # four steps later (as replays write them: the host length moves too)
        window_layers.advance(cache.layers, 1)
        now = hf_mask()[:, 0, 0, :]
        upto = layer.cumulative_length_int + 1
        assert not torch.equal(then[:, 0, 0, :upto], now[:, :upto])  # the frozen bound is wrong ...
        assert torch.equal(lifted[:, :upto], now[:, :upto])         # ... and the lift is right


def test_the_sliding_layers_the_kernels_do_not_serve_keep_a_loop_from_capturing():
    model = tiny("gemma3", window=8)
    cache = StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(torch.ones(1, 5, dtype=torch.long), **{CACHE_KWARG: cache})
    sliding = [i for i, layer in enumerate(cache.layers) if window_layers.sliding(layer)]
    assert sliding == [0, 2]  # sliding_window_pattern 2: layer 1 attends to everything
    assert window_layers.frozen_mask_layers(cache, set()) == sliding
    assert window_layers.frozen_mask_layers(cache, {1}) == sliding  # a full layer on the kernels is not enough
    assert window_layers.frozen_mask_layers(cache, {0, 1, 2}) == []
