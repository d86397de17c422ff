"""patch() with the real superoptimizer: fused, verified μGraphs swapped in (torch backend, CPU)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig

import mirage_serve
from tests.fixtures.budget import states_budget

from .parity import build



def test_searched_kernels_generate_the_same_tokens():
    cfg = LlamaConfig(vocab_size=61, hidden_size=30, intermediate_size=41, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    model = build(cfg)
    ids = torch.tensor([[5, 17, 3, 9]])
    want = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    report = mirage_serve.patch(model, backend="torch", batch_sizes=(2, 4),
                                search_budget=states_budget())
    assert not report.unpatched, str(report)
    # one per distinct program of the largest bucket, shared by both layers (sites.site_parts):
    # the stacked q/k/v, gate+up, o_proj, down_proj, and the norm
    assert report.searches == 5
    assert report.searches + report.reinstantiated == report.programs
    # norm sites fuse (norm + GEMV in one kernel); a lone projection has nothing to fuse, and at
    # this size the cost model ranks the library matmul first (search/cost.py: a custom kernel
    # pays the same launch and one memory latency)
    fused = [s for s in report.sites if len(s.modules) > 1]
    assert fused and all(s.source == "search" and s.kernels >= 1 and s.verdict.startswith("equivalent")
                         for s in fused), str(report)
    assert all(s.source == "search" and s.verdict for s in report.sites), str(report)
    got = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    mirage_serve.unpatch(model)
