"""bench_sampling.compare: logits compared while the sampled histories agree; a wrong model fails."""
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
