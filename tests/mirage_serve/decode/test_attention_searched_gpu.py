"""The searched decode attention inside patch() on the GPU: searched, built in place, captured, timed (GPU only)."""
from __future__ import annotations

import pytest
import torch

from .test_fast_loop import _tiny
from .test_fast_loop_gpu import STEPS, _cuda_batch, _hf_static


def _patched_runs(attention: str, dtype=torch.float32):
    """HF's static-cache greedy tokens, then the patched model's (graphed loop) twice, and what each layer ran."""
    import mirage_serve
    from mirage_serve.decode.attention_fast import attention_kernels, attention_verdicts
    from mirage_serve.options import PatchOptions

    model = _tiny("llama", dtype=dtype).to("cuda")  # float32: a difference from HF is a bug, not rounding
    ids, mask = _cuda_batch(model, [5, 9, 3])
    kw = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    want = _hf_static(model, ids, mask, **kw)
    mirage_serve.patch(model, batch_sizes=(1, 4), options=PatchOptions(attention=attention))
    got = [model.generate(input_ids=ids, attention_mask=mask, **kw) for _ in range(2)]
    verdicts, kernels = attention_verdicts(model), attention_kernels(model)
    mirage_serve.unpatch(model)
    return want, got, verdicts, kernels


@pytest.mark.gpu
def test_searched_attention_gives_hf_tokens_in_the_graphed_loop():
    want, (got, again), verdicts, kernels = _patched_runs("searched")
    assert set(verdicts.values()) == {"ok"}, verdicts
    assert all(w.startswith("searched: μGraph ") and "generated kernels" in w for w in kernels.values()), kernels
    assert torch.equal(got, want) and torch.equal(again, want)


@pytest.mark.gpu
def test_profiled_attention_times_both_and_keeps_the_faster():
    want, (got, _), verdicts, kernels = _patched_runs("profiled")
    assert set(verdicts.values()) == {"ok"}, verdicts
    for why in kernels.values():  # each shape timed on the GPU, both numbers reported
        assert why.startswith(("searched: ", "hand-written: the hand-written reference timed faster")), why
        assert why.count("µs") == 2, why
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_warm_chooses_the_attention_a_later_generate_finds_in_the_cache(tmp_path):
    # mirage-serve warm --cache-lengths: the first decode step of that shape in a later process searches nothing
    import mirage_serve
    from mirage_serve.cache.warm import warm_model
    from mirage_serve.decode.attention_fast import attention_kernels

    model = _tiny("llama", dtype=torch.float32)
    warmed = warm_model(model.config, batch_sizes=(1,), dtype="fp32", cache_dir=tmp_path, cache_lengths=(200,))
    assert list(warmed.attention) == ["batch 1, cache 256"], warmed.attention
    assert warmed.attention["batch 1, cache 256"].count("µs") == 2, warmed.attention  # timed against the reference
    model = model.to("cuda")
    mirage_serve.patch(model, batch_sizes=(1,), cache_dir=tmp_path)
    ids = torch.randint(1, model.config.vocab_size, (1, 254), device="cuda")
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2, do_sample=False,
                   pad_token_id=0)  # a 256-slot cache, the warmed shape
    kinds = set(attention_kernels(model).values())
    assert kinds and all("μGraph from the kernel cache" in why for why in kinds), kinds
    mirage_serve.unpatch(model)


@pytest.mark.gpu
def test_hand_written_mode_chooses_no_searched_graph():
    # the mode is read before any μGraph is chosen: no search, no profile of candidates on a first decode step
    want, (got, _), verdicts, kernels = _patched_runs("hand-written")
    assert set(kernels.values()) == {"hand-written: PatchOptions.attention='hand-written'"}, kernels
    assert set(verdicts.values()) == {"ok"} and torch.equal(got, want)
