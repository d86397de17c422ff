"""The model registry: every checkpoint present, published sizes, formulas equal HF's own modules."""
from __future__ import annotations

import pytest

from mirage_serve import registry

EXPECTED = ["Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.2-1B", "Llama-3.2-3B", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B",
            "Qwen3-0.6B", "Qwen3-8B", "Mistral-7B-v0.3", "Gemma-2-2B", "Gemma-3-1B", "Phi-3-mini",
            "SmolLM2-135M", "SmolLM2-1.7B", "OLMo-2-1B", "Granite-3.1-2B"]

# Published parameter counts (model cards), in millions; the formula must land within 0.5 %.
PUBLISHED_M = {"Llama-3.1-8B": 8030, "Llama-3.1-70B": 70554, "Llama-3.2-1B": 1236, "Llama-3.2-3B": 3213, "Qwen2.5-0.5B": 494,
               "Qwen2.5-1.5B": 1544, "Qwen2.5-7B": 7616, "Qwen3-8B": 8191, "Mistral-7B-v0.3": 7248,
               "Gemma-2-2B": 2614, "Phi-3-mini": 3821, "SmolLM2-135M": 134.5, "SmolLM2-1.7B": 1711,
               "OLMo-2-1B": 1485, "Granite-3.1-2B": 2534}


def test_every_checkpoint_is_registered_with_its_facts():
    assert sorted(registry.names()) == sorted(EXPECTED)
    for e in registry.entries():
        c = e.config
        for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps",
                    "rope_theta", "tie_word_embeddings", "max_position_embeddings"):
            assert key in c, (e.name, key)
        assert "/" in e.hub_id
        assert c["num_attention_heads"] % c["num_key_value_heads"] == 0, e.name


def test_family_specific_facts():
    g2 = registry.get("Gemma-2-2B").config
    assert (g2["attn_logit_softcapping"], g2["final_logit_softcapping"], g2["sliding_window"]) == (50.0, 30.0, 4096)
    assert registry.get("Gemma-3-1B").config["sliding_window"] == 512
    assert registry.get("Qwen2.5-0.5B").config["attention_bias"] is True
    assert registry.get("Qwen3-8B").config["attention_bias"] is False
    gr = registry.get("Granite-3.1-2B").config  # the multipliers that make Granite not Llama
    assert (gr["embedding_multiplier"], gr["residual_multiplier"], gr["attention_multiplier"],
            gr["logits_scaling"]) == (12.0, 0.22, 0.015625, 8.0)
    assert registry.get("OLMo-2-1B").config["model_type"] == "olmo2"  # post-norms, full-width q/k norms


@pytest.mark.parametrize("name", sorted(PUBLISHED_M))
def test_parameter_count_matches_published(name):
    got = registry.param_count(registry.get(name).config) / 1e6
    assert abs(got - PUBLISHED_M[name]) / PUBLISHED_M[name] < 0.005, (name, got)


@pytest.mark.parametrize("name", EXPECTED)
def test_formula_equals_hf_model_on_meta_device(name):
    """Build the HF model (2 layers, meta device: no memory) and count its parameters."""
    import torch
    from transformers import AutoModelForCausalLM

    facts = registry.get(name).with_overrides(num_hidden_layers=2).config
    config = registry.hf_config(facts)
    assert config.model_type == facts["model_type"]
    assert config.hidden_size == facts["hidden_size"] and config.head_dim == facts["head_dim"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    n_total = sum(p.numel() for p in model.parameters())
    assert registry.param_count(facts) == n_total
    embed = model.get_input_embeddings().weight.numel()
    lm_head = model.get_output_embeddings().weight.numel()
    # Read per step: everything except the embedding table, plus lm_head (which *is* it when tied).
    tied = facts["tie_word_embeddings"]
    assert registry.decode_params(facts) == n_total - embed + (lm_head if tied else 0)


def test_decode_bytes_llama8b_matches_the_documented_floor():
    """docs/measuring.md: Llama-3-8B floor 3.53 ms at 4.25 TB/s copy → ~15.0 GB read per step in bf16."""
    b = registry.decode_bytes(registry.get("Llama-3.1-8B").config, "bf16")
    assert abs(b / 4.25e12 * 1e3 - 3.53) < 0.01
    assert registry.decode_bytes(registry.get("Llama-3.1-8B").config, "fp32") == 2 * b


def test_unknown_names_get_closest_suggestions():
    with pytest.raises(registry.UnknownModelError) as info:
        registry.get("Llama-3-8B")
    assert "Llama-3.1-8B" in info.value.suggestions
    assert registry.suggest("qwen3-8") [0] == "Qwen3-8B"
    assert registry.suggest("zzzzzzzz") == []
    assert registry.get("qwen2.5-0.5b").name == "Qwen2.5-0.5B"  # case-insensitive


def test_overrides_replace_facts_and_keep_the_entry():
    e = registry.get("Qwen2.5-0.5B")
    small = e.with_overrides(num_hidden_layers=3, hidden_size=None)
    assert small.config["num_hidden_layers"] == 3 and small.config["hidden_size"] == 896
    assert e.config["num_hidden_layers"] == 24
    assert registry.param_count(small.config) < registry.param_count(e.config)


@pytest.mark.parametrize("name", EXPECTED)
def test_every_entry_builds_shrunk_with_random_weights_and_generates(name):
    """`bench NAME --layers 2 --set ...` path: shrunken facts (vocab 257 drops out-of-range special
    ids), normal(0, 0.02) weights from a seed, greedy generate of exactly 3 tokens."""
    import torch

    from mirage_serve.bench_load import load
    from mirage_serve.bench_timing import generate

    c = registry.get(name).config
    kv = 2 if c["num_key_value_heads"] != c["num_attention_heads"] else 4
    ov = dict(hidden_size=64, intermediate_size=96, vocab_size=257, num_attention_heads=4,
              num_key_value_heads=kv, head_dim=16)
    lm = load(name, dtype="fp32", device="cpu", layers=2, overrides=ov, seed=5)
    assert lm.random_weights and lm.facts["num_hidden_layers"] == 2 and lm.facts["vocab_size"] == 257
    w = lm.model.get_input_embeddings().weight
    assert abs(float(w.detach().std()) - 0.02) < 0.002  # initialised explicitly, not left to HF's init
    again = load(name, dtype="fp32", device="cpu", layers=2, overrides=ov, seed=5)
    assert torch.equal(w, again.model.get_input_embeddings().weight)  # same seed, same weights
    ids = torch.randint(3, 257, (3, 5), generator=torch.Generator().manual_seed(0))
    out = generate(lm.model, ids, 3, "dynamic")
    assert out.shape == (3, 3) and int(out.max()) < 257
