"""PatchOptions.fused_residual: the decoder layer's residual adds inside the o_proj / down_proj kernels.

Parity of whole patched models with the fusion on is in test_llama / test_qwen2 (``check_family``);
here: which layers it applies to, the hand-off's guards, and a kernel taking two activations.
"""
from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, LlamaConfig
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention, Gemma2DecoderLayer, Gemma2MLP
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP
from transformers.models.mistral.modeling_mistral import MistralAttention, MistralDecoderLayer, MistralMLP
from transformers.models.phi3.modeling_phi3 import Phi3Attention, Phi3DecoderLayer, Phi3MLP
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2DecoderLayer, Qwen2MLP
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer, Qwen3MLP

import mirage_serve
from mirage_serve.backends import Executor
from mirage_serve.options import PatchOptions
from mirage_serve.patch_residual import ResidualSlot, _unsupported
from mirage_serve.site_kernel import BucketKernel, bound_call

from .parity import build


@pytest.mark.parametrize("classes", [(LlamaDecoderLayer, LlamaAttention, LlamaMLP),
                                     (MistralDecoderLayer, MistralAttention, MistralMLP),
                                     (Qwen2DecoderLayer, Qwen2Attention, Qwen2MLP),
                                     (Qwen3DecoderLayer, Qwen3Attention, Qwen3MLP)])
def test_the_llama_style_layers_are_recognized(classes):
    assert _unsupported(*classes) is None


class _OldSpellingLayer(LlamaDecoderLayer):  # transformers 5.17-5.23 (whichever release is installed)
    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False, position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class _NewSpellingLayer(LlamaDecoderLayer):  # transformers 5.24+: the cache argument is ``cache``
    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


@pytest.mark.parametrize("layer_cls", [_OldSpellingLayer, _NewSpellingLayer])
def test_the_layer_forward_is_recognized_under_both_cache_spellings(layer_cls):
    # whichever transformers is installed, both releases' layer text is fused (CI and the GPU differ)
    assert _unsupported(layer_cls, LlamaAttention, LlamaMLP) is None


def test_other_layers_and_changed_returns_are_refused():
    assert "Gemma2DecoderLayer.forward is not" in _unsupported(Gemma2DecoderLayer, Gemma2Attention, Gemma2MLP)
    assert "Phi3DecoderLayer.forward is not" in _unsupported(Phi3DecoderLayer, Phi3Attention, Phi3MLP)

    class ScaledAttention(LlamaAttention):  # the projection's output is not what the layer receives
        def forward(self, hidden_states, *args, **kwargs):
            out, w = super().forward(hidden_states, *args, **kwargs)
            return out * 2, w

    class ScaledMLP(LlamaMLP):
        def forward(self, x):
            return 0.5 * self.down_proj(x)

    assert "does not return o_proj" in _unsupported(LlamaDecoderLayer, ScaledAttention, LlamaMLP)
    assert "does not return down_proj" in _unsupported(LlamaDecoderLayer, LlamaAttention, ScaledMLP)


def test_the_slot_adds_the_residual_unless_the_projection_did():
    slot = ResidualSlot()
    r, y = torch.ones(2, 3), torch.full((2, 3), 2.0)
    slot.offer(r)
    assert torch.equal(slot.added(y, r), r + y)  # the projection never took it: the layer adds
    slot.offer(r)
    assert slot.take() is r and slot.take() is None  # handed out once
    slot.out = y
    assert slot.added(y, r) is y  # the projection's output already holds the residual
    slot.offer(r)
    slot.take()
    slot.out = y
    with pytest.raises(RuntimeError, match="did not return its output to the layer unchanged"):
        slot.added(y.clone(), r)


def test_a_kernel_gets_its_activations_in_its_own_input_order():
    # a μGraph may list the residual before x: bound_call maps the site's (x, r) onto its inputs
    w = torch.tensor(7.0)

    def run(*args):
        return list(args)

    k = BucketKernel(Executor(run, "stand-in", False, 0, 0.0), (None, w, None), 1, acts=(1, 0))
    x, r = torch.tensor(1.0), torch.tensor(2.0)
    assert bound_call(k)(x, r) == [r, w, x]
    plain = BucketKernel(Executor(run, "stand-in", False, 0, 0.0), (w, None), 1)
    assert bound_call(plain)(x) == [w, x]


def test_a_family_without_the_layer_template_is_patched_as_before():
    cfg = Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = build(cfg)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,),
                                options=PatchOptions(fused_residual=True))
    assert "residual adds: in the" not in report.note and "residual adds not fused" in report.note
    assert not any("forward" in layer.__dict__ for layer in model.model.layers)


def test_the_layer_forward_is_the_original_one_when_the_option_is_off():
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = build(cfg)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,),
                                options=PatchOptions(fused_residual=False))
    assert "residual adds: in the" not in report.note
    assert not any("forward" in layer.__dict__ for layer in model.model.layers)


def test_recorded_hidden_states_are_not_fused(monkeypatch):
    # output_hidden_states is recorded by forward hooks on the layers: with a hook the layer adds
    # as the original does, and every recorded state is its own tensor with the original's value
    from mirage_serve import patch_prepare

    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = build(cfg)
    short = torch.randint(1, 97, (3, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(short, output_hidden_states=True).hidden_states
    mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,),
                       options=PatchOptions(fused_residual=True))
    residuals = []
    run = patch_prepare.SiteRuntime.run
    monkeypatch.setattr(patch_prepare.SiteRuntime, "run", lambda self, x, *r: residuals.append(bool(r))
                        or run(self, x, *r))
    with torch.no_grad():
        got = model(short, output_hidden_states=True).hidden_states
        assert not any(residuals)
        model(short)
    assert sum(residuals) == 2 * 3  # without the hooks, every layer fused both adds
    assert len({h.untyped_storage().data_ptr() for h in got}) == len(got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_layer_programs_name_the_residual_programs_patch_would_search():
    # what shipped_coverage / search_candidates see with the fusion on: the projections take r too
    from mirage_serve.site_programs import layer_programs
    from superopt.ir import digest

    plain = {(label, m): g for label, m, g in layer_programs("SmolLM2-135M", (1, 2), fused_residual=False)}
    fused = {(label, m): g for label, m, g in layer_programs("SmolLM2-135M", (1, 2), fused_residual=True)}
    assert plain.keys() == fused.keys()
    for key, g in fused.items():
        if key[0] in ("attn_out", "mlp_out"):
            assert len(g.inputs) == 3 and digest(g) != digest(plain[key])  # weight, x, residual
            assert [v.type.shape[0] for v in g.inputs if v.name.startswith("x")] == [key[1]] * 2
        else:
            assert digest(g) == digest(plain[key])
