"""PatchOptions.fused_residual: a decoder layer's residual adds inside the kernels of the projections
they add, found from the traced layer (mirage_serve.patching.residual).

Parity of whole patched models with the fusion on is in test_llama / test_qwen2 / test_phi3
(``check_family``) and, for the families patched from their traced layer, test_no_adapter; here:
which adds are found (any source text, any names), which are refused and why, and the run-time
hand-off's guards on a toy layer whose data flow changes after the trace.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (CohereConfig, Gemma2Config, GraniteConfig, LlamaConfig, MistralConfig, Phi3Config,
                          Qwen2Config, Qwen3Config)

import mirage_serve
from mirage_serve.backends import Executor
from mirage_serve.options import PatchOptions
from mirage_serve.patching.handoff import ResidualSlot, proj_forward
from mirage_serve.patching.residual import FusedAdd, plan_residual_adds
from mirage_serve.site_kernel import BucketKernel, bound_call

from .parity import build

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
LLAMA_ADDS = (FusedAdd(0, "self_attn.o_proj", None), FusedAdd(1, "mlp.down_proj", 0))


def plans_of(model, candidates=("self_attn.o_proj", "mlp.down_proj")):
    plans = plan_residual_adds(model, model.model.layers, list(candidates))
    assert not isinstance(plans, str), plans
    return plans


@pytest.mark.parametrize("config", [LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Phi3Config],
                         ids=lambda c: c.model_type)
def test_both_adds_of_pre_norm_layers_are_found(config):
    plans = plans_of(build(config(head_dim=8, **TINY) if config is not Phi3Config else config(**TINY)))
    assert [p.fused for p in plans] == [LLAMA_ADDS] * 2  # Phi-3's go through its eval-mode dropouts


class _InlineLayer(nn.Module):
    """A layer written nothing like Llama's: other names, adds inline, residual on the right."""

    def __init__(self, layer):
        super().__init__()
        self.pre, self.attention, self.norm2, self.ffn = (layer.input_layernorm, layer.self_attn,
                                                           layer.post_attention_layernorm, layer.mlp)

    def forward(self, x, attention_mask=None, position_ids=None, position_embeddings=None, **kwargs):
        x = self.attention(self.pre(x), attention_mask=attention_mask, position_ids=position_ids,
                           position_embeddings=position_embeddings, **kwargs)[0] + x
        return self.ffn(self.norm2(x)) + x


def test_the_source_text_and_names_do_not_matter():
    model = build(LlamaConfig(head_dim=8, **TINY))
    layers = model.model.layers
    for i, layer in enumerate(list(layers)):
        layers[i] = _InlineLayer(layer)
    plans = plans_of(model, ("attention.o_proj", "ffn.down_proj"))
    assert [p.fused for p in plans] == [(FusedAdd(0, "attention.o_proj", None), FusedAdd(1, "ffn.down_proj", 0))] * 2


def test_a_post_norm_moves_into_the_kernel_with_its_add():
    gemma = plans_of(build(Gemma2Config(head_dim=8, **TINY)))  # post-attention / post-feedforward norms
    assert [p.fused for p in gemma] == [(FusedAdd(0, "self_attn.o_proj", None, "post_attention_layernorm"),
                                         FusedAdd(1, "mlp.down_proj", 0, "post_feedforward_layernorm"))] * 2


@pytest.mark.parametrize("model_type, adds", [
    ("olmo2", (("self_attn.o_proj", "post_attention_layernorm"), ("mlp.down_proj", "post_feedforward_layernorm"))),
    ("glm4", (("self_attn.o_proj", "post_self_attn_layernorm"), ("mlp.down_proj", "post_mlp_layernorm"))),
    ("starcoder2", (("self_attn.o_proj", None), ("mlp.c_proj", None))),
    ("smollm3", (("self_attn.o_proj", None), ("mlp.down_proj", None))),
])
def test_families_without_an_adapter_fuse_from_their_traced_layer(model_type, adds):
    from transformers import AutoConfig

    from mirage_serve.patching.partition import family_from_trace
    from mirage_serve.patching.sites import ProjSite

    model = build(AutoConfig.for_model(model_type, **TINY))
    family, why = family_from_trace(model, model_type)
    candidates = [s.proj for s in family.sites if isinstance(s, ProjSite) and s.tail is None]
    plans = plans_of(model, candidates)
    assert [tuple((f.proj, f.post) for f in p.fused) for p in plans] == [adds] * 2
    assert plans[0].why_not == {}  # q/k/v reach the adds only through o_proj: nothing to say about them


def test_a_scaled_branch_moves_into_the_kernel_with_its_add():
    model = build(GraniteConfig(residual_multiplier=0.22, **TINY))  # residual + out * 0.22
    assert [p.fused for p in plans_of(model)] == [(FusedAdd(0, "self_attn.o_proj", None, scale=(0, "mul", 0.22)),
                                                   FusedAdd(1, "mlp.down_proj", 0, scale=(1, "mul", 0.22)))] * 2
    ids = torch.tensor([[5, 9, 2, 7]])
    want = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,))
    assert "in the kernels of mlp.down_proj (× 0.22), self_attn.o_proj (× 0.22) in 2/2 layers" in report.note
    assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0), want)
    mirage_serve.unpatch(model)


def test_adds_of_an_output_changed_otherwise_stay():
    model = build(LlamaConfig(head_dim=8, **TINY))
    attn_cls = type(model.model.layers[0].self_attn)

    class ScaledAttention(attn_cls):  # the projection's output is not what the layer adds
        def forward(self, hidden_states, *args, **kwargs):
            out, w = attn_cls.forward(self, hidden_states, *args, **kwargs)
            return out * 2, w

    for layer in model.model.layers:
        layer.self_attn.__class__ = ScaledAttention
    plans = plans_of(model)
    assert [p.fused for p in plans] == [(FusedAdd(1, "mlp.down_proj", 0),)] * 2
    assert "constant multiple" in plans[0].why_not["residual add after self_attn.o_proj"]  # scaled in another module


def test_an_output_read_besides_the_add_stays():
    model = build(LlamaConfig(head_dim=8, **TINY))
    seen = []
    for layer in model.model.layers:
        o_proj = layer.self_attn.o_proj
        o_proj.forward = (lambda f: lambda x: (lambda y: (seen.append(y.sum()), y)[1])(f(x)))(o_proj.forward)
    plans = plans_of(model)
    assert [p.fused for p in plans] == [(FusedAdd(1, "mlp.down_proj", 0),)] * 2
    assert "read by something besides the add" in plans[0].why_not["residual add into self_attn.o_proj"]


def test_a_parallel_layer_fuses_the_add_whose_residual_exists_first():
    # Cohere: residual + attention + mlp, after both ran: the first add takes o_proj's output with the
    # layer's input; the second's residual (the first add's result) comes after down_proj ran
    plans = plans_of(build(CohereConfig(**TINY)))
    assert [p.fused for p in plans] == [(FusedAdd(0, "self_attn.o_proj", None),)] * 2
    assert "computed after the projection runs" in plans[0].why_not["residual add into mlp.down_proj"]


class _Toy(nn.Module):
    """A layer ``h + proj(h)`` that, once ``flip`` is set, adds a scaled copy of the output instead."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6, bias=False)
        self.flip = False

    def forward(self, h, **kwargs):
        y = self.proj(h)
        if self.flip:
            y = y * 1.0
        return h + y


class _ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 6)
        self.layers = nn.ModuleList([_Toy()])

    def forward(self, input_ids, **kwargs):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        return h


class _Kernel:
    """A stand-in runtime: ``r + x Wᵀ`` in one call, counting the calls that took a residual."""

    def __init__(self, proj):
        self.proj, self.calls = proj, 0

    def eligible(self, module, x, r):
        return True

    def run(self, x, r):
        self.calls += 1
        return (r + nn.functional.linear(x, self.proj.weight),)


def test_the_hand_off_adds_once_and_refuses_a_changed_output():
    model = _ToyModel()
    (plan,) = plan_residual_adds(model, model.layers, ["proj"])
    assert plan.fused == (FusedAdd(0, "proj", None),)
    layer = model.layers[0]
    kernel, slot = _Kernel(layer.proj), ResidualSlot(layer.proj)
    layer.proj.forward = proj_forward(layer.proj, kernel, slot)
    layer.forward = plan.forward(layer, {"proj": slot})
    h = torch.randn(2, 6)
    with torch.no_grad():
        want = h + nn.functional.linear(h, layer.proj.weight)
        assert torch.equal(layer(h), want) and kernel.calls == 1  # added in the kernel, not again
        hook = layer.proj.register_forward_hook(lambda *a: None)
        assert torch.equal(layer(h), want) and kernel.calls == 1  # a hook could see the sum: no hand-off
        hook.remove()
        layer.flip = True  # the projection's output no longer reaches the add as it is
        with pytest.raises(RuntimeError, match="did not come back to the layer's add unchanged"):
            layer(h)
    assert slot.residual is slot.out is None  # nothing offered outlives the call


def test_the_slot_hands_a_residual_out_once():
    slot, r = ResidualSlot(), torch.ones(2)
    slot.offer(r)
    assert slot.take() is r and slot.taken is r and slot.take() is None


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


def test_a_layer_without_fusable_adds_keeps_its_forward():
    from transformers import AutoConfig

    model = build(AutoConfig.for_model("phi", **TINY))  # Phi-2: attention + MLP + residual, after both ran
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,),
                                options=PatchOptions(fused_residual=True))
    assert "residual adds: in the" not in report.note and "stays in the layer" in report.note
    assert not any("forward" in layer.__dict__ for layer in model.model.layers)


def test_the_layer_forward_is_the_original_one_when_the_option_is_off():
    model = build(LlamaConfig(head_dim=8, **TINY))
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,),
                                options=PatchOptions(fused_residual=False))
    assert "residual adds: in the" not in report.note
    assert not any("forward" in layer.__dict__ for layer in model.model.layers)


def test_a_forward_it_cannot_rewrite_keeps_its_adds_with_the_reason():
    model = build(LlamaConfig(head_dim=8, **TINY))
    layer_cls = type(model.model.layers[0])

    class Wrapped(layer_cls):  # super() makes the forward a closure: its source cannot be recompiled alone
        def forward(self, hidden_states, *args, **kwargs):
            return super().forward(hidden_states, *args, **kwargs)

    for layer in model.model.layers:
        layer.__class__ = Wrapped
    why = plan_residual_adds(model, model.model.layers, ["self_attn.o_proj", "mlp.down_proj"])
    assert isinstance(why, str) and "uses a closure or super() (__class__)" in why
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,))
    assert "residual adds stay in the layer (" in report.note
    assert "Wrapped.forward uses a closure or super() (__class__))" in report.note
    assert not report.unpatched  # the sites themselves are patched as always
    mirage_serve.unpatch(model)
