"""PatchOptions: patch()'s behaviour switches as one frozen argument, defaults from the knobs only."""
from __future__ import annotations

import dataclasses

import pytest

from mirage_serve import knobs
from mirage_serve.options import PatchOptions

FIELDS = {"pdl": knobs.PDL, "paired_launch": knobs.PAIRED_LAUNCH, "fused_residual": knobs.FUSED_RESIDUAL,
          "stacked_projections": knobs.STACKED_PROJECTIONS, "final_norm": knobs.FINAL_NORM,
          "research": knobs.RESEARCH, "retime_launches": knobs.RETIME_LAUNCHES,
          "deterministic": knobs.DETERMINISTIC}


def test_each_switch_is_a_field_whose_default_is_its_knob(monkeypatch):
    assert {f.name for f in dataclasses.fields(PatchOptions)} == set(FIELDS) | {"attention", "lm_head"}
    for name, knob in FIELDS.items():
        monkeypatch.delenv(knob.name, raising=False)
        assert getattr(PatchOptions(), name) is knob.default
        monkeypatch.setenv(knob.name, "0" if knob.default else "1")
        assert getattr(PatchOptions(), name) is (not knob.default), knob.name
        # an argument wins over the environment, which is read only when the options are made
        assert getattr(PatchOptions(**{name: knob.default}), name) is knob.default
        made = PatchOptions()
        monkeypatch.setenv(knob.name, "1" if knob.default else "0")
        assert getattr(made, name) is (not knob.default)


def test_the_attention_choice_defaults_to_its_knob_and_is_checked(monkeypatch):
    monkeypatch.delenv(knobs.ATTENTION.name, raising=False)
    assert PatchOptions().attention == "profiled" == knobs.ATTENTION.default
    monkeypatch.setenv(knobs.ATTENTION.name, "Hand-Written")
    assert PatchOptions().attention == "hand-written"
    assert PatchOptions(attention="searched").attention == "searched"  # an argument wins
    monkeypatch.setenv(knobs.ATTENTION.name, "fastest")
    with pytest.raises(ValueError, match="MIRAGE_SERVE_ATTENTION.*profiled"):
        PatchOptions()


def test_the_output_projection_choice_defaults_to_its_knob_and_is_checked(monkeypatch):
    monkeypatch.delenv(knobs.LM_HEAD.name, raising=False)
    assert PatchOptions().lm_head == "cached" == knobs.LM_HEAD.default
    monkeypatch.setenv(knobs.LM_HEAD.name, "1")  # the boolean spellings it had before "cached"
    assert PatchOptions().lm_head == "search"
    assert PatchOptions(lm_head="off").lm_head == "off"  # an argument wins
    monkeypatch.setenv(knobs.LM_HEAD.name, "always")
    with pytest.raises(ValueError, match="MIRAGE_SERVE_LM_HEAD.*cached"):
        PatchOptions()


def test_options_are_frozen_and_typed():
    o = PatchOptions(pdl=False, paired_launch=False, fused_residual=False, research=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.pdl = True
    with pytest.raises(TypeError, match="pdl"):
        PatchOptions(pdl="0")
    assert dataclasses.replace(o, pdl=True).pdl and not o.pdl


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg).eval()


def test_patch_hands_its_options_to_the_builds(monkeypatch):
    import mirage_serve
    from mirage_serve import backends

    seen = []
    build = backends.build

    def spy(*args, **kwargs):
        seen.append((kwargs.get("pdl"), kwargs.get("deterministic")))
        return build(*args, **kwargs)

    monkeypatch.setattr(backends, "build", spy)
    model = _tiny_llama()
    for pdl, deterministic in ((False, True), (True, False)):
        seen.clear()
        mirage_serve.patch(model, search_budget=0, batch_sizes=(1,),
                           options=PatchOptions(pdl=pdl, deterministic=deterministic))
        mirage_serve.unpatch(model)
        assert seen and set(seen) == {(pdl, deterministic)}


def test_patch_without_fused_residual_leaves_the_adds_to_the_layer():
    import mirage_serve

    model = _tiny_llama()
    off = mirage_serve.patch(model, search_budget=0, batch_sizes=(1,), options=PatchOptions(fused_residual=False))
    mirage_serve.unpatch(model)
    on = mirage_serve.patch(model, search_budget=0, batch_sizes=(1,), options=PatchOptions(fused_residual=True))
    mirage_serve.unpatch(model)
    assert "residual adds: in the kernels of" in on.note and "residual adds: in the kernels of" not in off.note


def test_patch_refuses_options_of_another_type():
    import mirage_serve

    with pytest.raises(mirage_serve.patching.pipeline.PatchError, match="PatchOptions"):
        mirage_serve.patch(_tiny_llama(), options={"pdl": False})
