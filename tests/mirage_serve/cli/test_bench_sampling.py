"""bench_sampling.compare: logits compared while the sampled histories agree; a wrong model fails;
against a wide reference, a run as accurate as eager passes where the two bf16 runs disagree.
bench_sampling.reference: the model widened in place, teacher-forced, then given back bit-identical."""
from __future__ import annotations

import torch

from mirage_serve.bench_sampling import compare, summary


def _run(seed=0, b=3, steps=6, vocab=50):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, steps), generator=g), torch.randn(b, steps, vocab, generator=g)


def test_agreeing_samples_within_tolerance_pass():
    tokens, logits = _run()
    got = logits + 1e-4 * torch.randn_like(logits)
    r = compare((tokens, logits), (tokens.clone(), got), tokens.clone(), 1e-2)
    assert r["ok"] and r["steps_compared"] == 6 and r["fast_loop_first_divergence"] is None
    assert r["first_decode_step"]["step"] == 1 and 0 < r["first_decode_step"]["max_abs"] < 1e-3
    assert "batch 1 OK" in summary({1: r}) and "samples the same tokens" in summary({1: r})


def test_logits_are_compared_up_to_the_step_after_the_first_different_draw():
    tokens, logits = _run()
    got_tokens = tokens.clone()
    got_tokens[2, 3] += 1  # a different draw at step 3: steps 0..3 share their history
    got = logits.clone()
    got[:, 4:] += 10.0  # later steps follow another history: not compared
    r = compare((tokens, logits), (got_tokens, got), got_tokens, 1e-2)
    assert r["ok"] and r["steps_compared"] == 4 and r["fast_loop_first_divergence"] == 3
    assert "samples another token at step 3" in summary({8: r})


def test_wrong_logits_fail():
    tokens, logits = _run()
    got = logits.clone()
    got[:, 1] *= 1.05  # 5% off at the first decode step
    r = compare((tokens, logits), (tokens, got), tokens, 1e-2)
    assert not r["ok"] and r["worst"]["step"] == 1
    assert "batch 1 FAILED" in summary({1: r})


def _noisy(truth, rel, g):
    """``truth`` plus Gaussian noise of relative Frobenius size ``rel`` per step (one bf16 run's rounding)."""
    noise = torch.randn(truth.shape, generator=g)
    return truth + rel * noise * truth.norm(dim=(0, 2), keepdim=True) / noise.norm(dim=(0, 2), keepdim=True)


def test_two_roundings_as_far_from_the_reference_pass_though_they_disagree():
    # eager and the patched model each 2e-2 from the wide reference (HF's own bf16 error on Gemma-2-2B):
    # they disagree by ~2.8e-2 > 1e-2, yet the patched model is as accurate as eager
    tokens, truth = _run(steps=8, vocab=97)
    g = torch.Generator().manual_seed(5)
    eager, ours = _noisy(truth, 2e-2, g), _noisy(truth, 2e-2, g)
    r = compare((tokens, eager), (tokens, ours), tokens, 1e-2, reference=truth)
    assert not r["agrees"] and r["worst"]["rel"] > 2e-2
    assert r["as_accurate_as_eager"] and r["ok"]
    assert 0.8 < r["reference_worst"]["ours_vs_reference"] / r["reference_worst"]["eager_vs_reference"] < 1.25
    assert "batch 1 OK (as accurate as eager)" in summary({1: r}) and "against float32 at step" in summary({1: r})
    assert compare((tokens, eager), (tokens, ours), tokens, 1e-2)["ok"] is False  # without the reference


def test_logits_farther_from_the_reference_than_eager_fail():
    tokens, truth = _run(steps=8, vocab=97)
    g = torch.Generator().manual_seed(6)
    eager = _noisy(truth, 2e-2, g)
    for s in (1, 7):  # 5% off at one decode step, otherwise as accurate as eager
        ours = _noisy(truth, 2e-2, g)
        ours[:, s] *= 1.05
        r = compare((tokens, eager), (tokens, ours), tokens, 1e-2, reference=truth)
        assert not r["ok"] and not r["as_accurate_as_eager"] and r["reference_worst"]["step"] == s
        assert "batch 1 FAILED" in summary({1: r})


def test_within_tolerance_of_eager_passes_whatever_the_reference():
    tokens, truth = _run(steps=4)
    g = torch.Generator().manual_seed(7)
    eager = _noisy(truth, 1e-3, g)
    ours = eager + 1e-4 * torch.randn(eager.shape, generator=g)
    r = compare((tokens, eager), (tokens, ours), tokens, 1e-2, reference=truth)
    assert r["agrees"] and r["ok"] and "batch 1 OK:" in summary({1: r})


def test_reference_is_the_wide_model_teacher_forced_on_eagers_tokens():
    from transformers import Gemma2Config, AutoModelForCausalLM

    from mirage_serve.bench_load import random_init_
    from mirage_serve.bench_sampling import reference, sample

    cfg = Gemma2Config(vocab_size=97, hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                       num_attention_heads=3, num_key_value_heads=1, head_dim=16, sliding_window=5,
                       query_pre_attn_scalar=16, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    random_init_(model, 3)  # the bench's initialisation: (1 + w) norms near 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    where = {n: p.data_ptr() for n, p in model.named_parameters()}
    ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(4))
    tokens, logits = sample(model, ids, 5, seed=0, with_logits=True)
    torch.set_float32_matmul_precision("high")
    try:
        ref = reference(model, ids, tokens, dtype=torch.float64)
        assert torch.get_float32_matmul_precision() == "high"  # the caller's setting given back
    finally:
        torch.set_float32_matmul_precision("highest")
    assert ref.shape == logits.shape == (2, 5, 97) and ref.dtype == torch.float32
    state = model.state_dict()  # widened, then given back its own storage: bit-identical, bf16, still tied
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == where
    assert all(state[k].dtype == torch.bfloat16 and torch.equal(state[k], v) for k, v in before.items())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(b.dtype == torch.bfloat16 for n, b in model.named_buffers() if "embed_scale" in n)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    wide = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64).eval()
    wide.load_state_dict({k: v.double() for k, v in before.items()})
    for name, buf in model.named_buffers():  # the bf16 model's own embedding scale, bf16(sqrt(48)), as HF rounds it
        wide.get_buffer(name).copy_(buf)
    seq = torch.cat([ids, tokens], 1)
    with torch.no_grad():
        for s in (0, 2, 4):  # step s: predicted from the prompt and the s tokens eager drew before it
            want = wide(seq[:, :7 + s]).logits[:, -1]
            torch.testing.assert_close(ref[:, s].double(), want, rtol=1e-6, atol=1e-6)
    err = float((logits.double() - ref.double()).norm() / ref.double().norm())
    assert 1e-4 < err < 5e-2  # eager's bf16 rounding, seen against the wide reference
