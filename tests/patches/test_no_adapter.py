"""Every decoder family patched from its traced layer (mirage_serve.patching.partition).

Two sets of families, each built from a tiny config (2 layers, hidden 96, vocab 97, fp32, random
weights):

* the ten below that have no adapter in patches/ (issue 28's nine, and OLMo-1 for clip_qkv), with
  the features that make them not Llama switched on as their published checkpoints have them (parallel attention + MLP, partial rotary,
  qkv bias, LayerNorm, fused qkv, post-norms, embedding / residual / logit multipliers, logit_scale);
* every model_type of the registry (models/), from the facts of its smallest entry, with its
  adapter hidden: the traced sites must be the ones the adapter declares by name (and the adapter
  path itself is checked by tests/patches/test_<family>.py).

Each is partitioned from one traced decode-shaped forward into at least 3 sites a layer, patched on
the torch backend with a small real search (every site patched, its kernels running on every
decode step, none on the prefill), and must generate the same greedy tokens for 16 steps at
batch 1 and batch 3 (left padded); unpatch gives back every parameter and the forward bit for bit.
A model whose layers cannot be traced or partitioned is left untouched with a one-line reason.
"""
from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn
from transformers import AutoConfig

import mirage_serve
from mirage_serve import registry
from mirage_serve.patching import pipeline, prepare
from mirage_serve.bench_load import _override
from mirage_serve.patching.partition import family_from_trace
from mirage_serve.patching.sites import NormSite, ProjSite

from .parity import _generate, build, prompts

search = pytest.importorskip("superopt.search", reason="superopt.search is not installed")

SMALL = dict(vocab_size=97, hidden_size=96, intermediate_size=136, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
# What the published checkpoints switch on that the config class's defaults leave off.
EXTRA = {
    "stablelm": dict(use_qkv_bias=True),                 # StableLM-2-1.6B: qkv bias, partial rotary 0.25
    "olmo": dict(clip_qkv=0.5),  # OLMo-1.7-7B clamps q, k, v to ±8; ±0.5 clamps this tiny model's (std ~0.8)
    "granite": dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                    logits_scaling=8.0),                 # Granite-3.x (also in models/Granite-3.1-2B.json)
}
# The sites each no-adapter family's layer partitions into (kind and module path), from its data flow.
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
LLAMA_LIKE = {("norm", "input_layernorm"): QKV, ("norm", "post_attention_layernorm"): ("mlp",),
              ("proj", "self_attn.o_proj"): None, ("proj", "mlp.down_proj"): None}
EXPECTED = {
    # post-norm layers: no norm feeds a projection, so each attention projection is a site alone and
    # the MLP (on the residual stream) a block site up to down_proj
    "olmo2": {**{("proj", p): None for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "mlp.down_proj")}, ("block", "mlp"): "down_proj"},
    # OLMo's LayerNorm has no weight, so it is no norm site (it runs in the layer's forward); the
    # clamp of clip_qkv reads each projection's output, outside the sites
    "olmo": {**{("proj", p): None for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "self_attn.o_proj", "mlp.down_proj")}, ("block", "mlp"): "down_proj"},
    "granite": LLAMA_LIKE, "smollm3": LLAMA_LIKE, "glm4": LLAMA_LIKE, "stablelm": LLAMA_LIKE,
    "starcoder2": {("norm", "input_layernorm"): QKV, ("norm", "post_attention_layernorm"): ("mlp",),
                   ("proj", "self_attn.o_proj"): None, ("proj", "mlp.c_proj"): None},
    # parallel attention + MLP: one norm feeds q, k, v and the MLP
    "phi": {("norm", "input_layernorm"): QKV + ("mlp",), ("proj", "self_attn.dense"): None,
            ("proj", "mlp.fc2"): None},
    "cohere": {("norm", "input_layernorm"): QKV + ("mlp",), ("proj", "self_attn.o_proj"): None,
               ("proj", "mlp.down_proj"): None},
    "gpt_neox": {("norm", "input_layernorm"): ("attention.query_key_value",),
                 ("norm", "post_attention_layernorm"): ("mlp",),
                 ("proj", "attention.dense"): None, ("proj", "mlp.dense_4h_to_h"): None},
}
REGISTRY_TYPES = sorted({e.model_type for e in registry.entries()})
BUDGET = search.SearchBudget(max_states=300, max_seconds=1.0)


def _config(model_type: str):
    """The tiny config of ``model_type``: its smallest registry entry's facts, shrunk, where the
    registry has one (Granite's multipliers, Gemma's softcaps and windows come along); else the
    config class's defaults."""
    entries = [e for e in registry.entries() if e.model_type == model_type]
    if not entries:
        try:
            return AutoConfig.for_model(model_type, **SMALL, **EXTRA.get(model_type, {}))
        except ValueError as e:  # "Unrecognized model identifier": an older transformers
            pytest.skip(f"transformers {transformers.__version__} has no config class for {model_type!r} ({e})"
                        .splitlines()[0][:160])
    small = min(entries, key=lambda e: registry.param_count(e.config))
    hd = SMALL["hidden_size"] // SMALL["num_attention_heads"]
    facts = _override(dict(small.config), 2, dict(SMALL, head_dim=hd))
    if "attention_multiplier" in facts:  # Granite scales scores by 1 / head_dim
        facts["attention_multiplier"] = 1.0 / hd
    return registry.hf_config(facts)


def _shape(site) -> tuple:
    if isinstance(site, ProjSite):
        return ("block", site.proj) if site.tail else ("proj", site.proj), site.tail
    return ("norm", site.norm), tuple(c.path for c in site.consumers)


def _tails(sites) -> dict:
    return {c.path: c.tail for s in sites if isinstance(s, NormSite) for c in s.consumers}


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("model_type", sorted(set(EXPECTED) | set(REGISTRY_TYPES)))
def test_family_patched_from_its_traced_layer(model_type, monkeypatch):
    family_for, types = pipeline._adapters()
    adapter = family_for(model_type)
    monkeypatch.setattr(pipeline, "_adapters", lambda: (lambda _: None, types))  # the adapter, hidden
    cfg = _config(model_type)
    assert cfg.model_type == model_type
    model = build(cfg)
    ids1, ids3, mask3 = prompts(cfg.vocab_size, pad=0)
    ref = {1: _generate(model, ids1, None)[0], 3: _generate(model, ids3, mask3)[0]}
    with torch.no_grad():
        before = model(ids3, attention_mask=mask3).logits
    params = _snapshot(model)

    family, why = family_from_trace(model, model_type)
    assert family is not None, why
    if adapter is not None:  # the data flow finds what the adapter declares by name
        assert {_shape(s) for s in family.sites} == {_shape(s) for s in adapter.sites}
        assert _tails(family.sites) == _tails(adapter.sites)
    else:
        assert dict(_shape(s) for s in family.sites) == EXPECTED[model_type]
    assert len(family.sites) >= 3

    # the adapter families' site programs are searched in their own tests; here the no-adapter
    # families' are (a small real search), the others run unsearched to keep CI short
    report = mirage_serve.patch(model, backend="torch", search_budget=0 if adapter else BUDGET,
                                batch_sizes=(4,))
    text = str(report)
    assert report.supported and "traced decoder layer" in report.note, text
    # and the final norm, outside the layers; OLMo's has no weight, so nothing tells it from any other op
    final = [s.site for s in report.sites if s.layer < 0]
    assert final == ([] if model_type == "olmo" else ["final_norm"]), text
    assert len(report.sites) == len(family.sites) * cfg.num_hidden_layers + len(final)
    assert not report.unpatched, text
    assert all(s.check_error is not None and s.check_error <= 1e-5 for s in report.sites), text
    assert "not patched: forward calls with more than 4 rows (batch × tokens: prefill" in text

    calls = []
    run = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, x, *r: calls.append(1) or run(self, x, *r))
    with torch.no_grad():  # 21 rows > the largest bucket: every site runs its original modules
        assert torch.equal(model(ids3, attention_mask=mask3).logits, before) and not calls
    for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items():
        assert torch.equal(_generate(model, ids, m)[0], ref[b]), f"{model_type} batch {b}: greedy tokens differ"
    assert len(calls) >= 2 * 15 * len(report.sites)  # the 15 decode steps of both batches ran every site

    assert mirage_serve.unpatch(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    after = model.state_dict()
    assert list(after) == list(params) and all(torch.equal(after[k], v) for k, v in params.items())
    with torch.no_grad():
        assert torch.equal(model(ids3, attention_mask=mask3).logits, before)


class _Norm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d) * 0.1 + 1)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class _Layer(nn.Module):
    """``norm(x)`` feeds q and, through an add, the output: the norm output is read outside its projection."""

    def __init__(self, d):
        super().__init__()
        self.norm, self.q, self.o = _Norm(d), nn.Linear(d, d), nn.Linear(d, d, bias=False)

    def forward(self, x):
        n = self.norm(x)
        return x + self.o(self.q(n) + n)


class _Toy(nn.Module):
    def __init__(self, d=24, traceable=True):
        super().__init__()
        self.config = type("Config", (), {"model_type": "toy_no_adapter"})()
        self.embed = nn.Embedding(11, d)
        self.layers = nn.ModuleList(_Layer(d) for _ in range(2))
        self.traceable = traceable

    def forward(self, input_ids, use_cache=False):
        if not self.traceable:
            raise RuntimeError("this forward cannot run")
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        return h


def test_norm_read_outside_its_projections_is_no_norm_site():
    family, why = family_from_trace(_Toy().eval(), "toy")
    assert why == ""
    # the norm's output also feeds an add: deferring the norm would hand that add a placeholder
    assert [type(s) for s in family.sites] == [ProjSite, ProjSite]
    assert {s.proj for s in family.sites} == {"q", "o"}
    assert any(b == "norm" and "outside the projections" in w for b, w in family.not_patched)
    assert not any(isinstance(s, NormSite) for s in family.sites)


@pytest.mark.parametrize("toy, reason", [
    (lambda: _Toy(traceable=False), "could not be traced (RuntimeError: this forward cannot run)"),
    (lambda: nn.Sequential(nn.Linear(4, 4)), "no decoder layer list found"),
])
def test_layer_that_cannot_be_partitioned_is_left_untouched(toy, reason):
    model = toy().eval()
    params = _snapshot(model)
    report = mirage_serve.patch(model, backend="torch", search_budget=0)
    assert not report.supported and not report.sites
    assert reason in report.note and "left unchanged" in report.note and "\n" not in report.note
    assert not pipeline.is_patched(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in params.items())


class _Mlp(nn.Module):
    """A gated MLP; ``scale`` != 1 multiplies after down: its output is then not down's output."""

    def __init__(self, d, scale=1.0):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, 40), nn.Linear(d, 40), nn.Linear(40, d)
        self.scale = scale

    def forward(self, x):
        y = self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return y if self.scale == 1.0 else y * self.scale


class _PostNormLayer(nn.Module):
    """OLMo-2's shape: ``x + norm(mlp(x))``, the MLP on the residual stream, no norm before it."""

    def __init__(self, d, scale):
        super().__init__()
        self.mlp, self.norm = _Mlp(d, scale), _Norm(d)

    def forward(self, x):
        return x + self.norm(self.mlp(x))


@pytest.mark.parametrize("scale, sites", [
    (1.0, {("block", "mlp"): "down", ("proj", "mlp.down"): None}),
    # the block's output is not its last projection's: each projection is a site alone
    (0.5, {("proj", "mlp.gate"): None, ("proj", "mlp.up"): None, ("proj", "mlp.down"): None}),
])
def test_block_on_the_residual_stream_is_one_site_up_to_its_tail(scale, sites, monkeypatch):
    model = _Toy()
    for i in range(2):
        model.layers[i] = _PostNormLayer(24, scale)
    model.eval()
    family, why = family_from_trace(model, "toy")
    assert family is not None, why
    assert dict(_shape(s) for s in family.sites) == sites
    ids = torch.tensor([[3], [7], [1]])  # [3, 1]: decode-sized, through the site kernels
    with torch.no_grad():
        before = model(ids)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,))
    assert report.supported and not report.unpatched and len(report.sites) == 2 * len(sites), str(report)
    calls = []
    run = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, x, *r: calls.append(1) or run(self, x, *r))
    with torch.no_grad():
        got = model(ids)
    assert len(calls) == len(report.sites)
    torch.testing.assert_close(got, before, rtol=1e-5, atol=1e-6)
    assert mirage_serve.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(ids), before)


def _untraceable(layer_class: type) -> type:
    """``layer_class`` whose forward refuses to run under a tracer (as a layer calling into code
    that a TorchFunctionMode cannot see through would); it runs as before everywhere else."""
    def forward(self, *args, **kwargs):
        if torch._C._is_torch_function_mode_enabled():
            raise RuntimeError("this decoder layer cannot be traced")
        return layer_class.forward(self, *args, **kwargs)
    return type(f"Untraceable{layer_class.__name__}", (layer_class,), {"forward": forward})


def test_family_whose_layer_cannot_be_traced_is_left_untouched():
    cfg = _config("olmo2")  # a family with no adapter: tracing is its only way in
    model = build(cfg)
    untraceable = _untraceable(type(model.model.layers[0]))
    for layer in model.model.layers:
        layer.__class__ = untraceable
    ids3, mask3 = prompts(cfg.vocab_size, pad=0)[1:]
    ref = _generate(model, ids3, mask3)[0]
    params = _snapshot(model)
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,))
    text = str(report)
    assert not report.supported and not report.sites, text
    assert ("no adapter" in report.note and "could not be traced (RuntimeError: this decoder layer cannot "
            "be traced); the model was left unchanged" in report.note and "\n" not in report.note), text
    assert text.splitlines()[1:] == [report.note]
    assert not pipeline.is_patched(model) and all("forward" not in m.__dict__ for m in model.modules())
    after = model.state_dict()
    assert list(after) == list(params) and all(torch.equal(after[k], v) for k, v in params.items())
    assert torch.equal(_generate(model, ids3, mask3)[0], ref)


class _NormOnly(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.head = _Norm(d), nn.Linear(d, d)  # head: outside the layers

    def forward(self, x):
        return x + self.norm(x)


def test_layers_without_any_site_are_reported():
    """A layer list whose layers hold a projection that the forward never calls gives no site."""
    model = _Toy().eval()
    for i in range(2):
        model.layers[i] = _NormOnly(24)
    family, why = family_from_trace(model, "toy")
    assert family is None and why.startswith("the decoder layer could not be partitioned into sites (norm: ")
    assert "\n" not in why


class _WithIdleTower(_Toy):
    """A longer layer list the text forward never runs (as a vision tower would be)."""

    def __init__(self):
        super().__init__()
        self.tower = nn.ModuleList(nn.Sequential(nn.Linear(24, 24)) for _ in range(5))


def test_the_layer_list_is_the_one_the_forward_runs():
    family, why = family_from_trace(_WithIdleTower().eval(), "toy")
    assert family is not None and family.layers == ("layers",), why
