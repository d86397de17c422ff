"""What patch() searches with when the user gives no budget (``optimize.default_budget``)."""
from __future__ import annotations

import pytest

from mirage_serve import optimize, verify_parallel
from mirage_serve.decode.attention_searched import _attention_budget

search = pytest.importorskip("superopt.search")


@pytest.mark.parametrize("cores,workers", [(16, 15), (2, 1), (1, 1)])
def test_a_gpu_search_spreads_its_block_searches_over_the_cores_but_one(monkeypatch, cores, workers):
    monkeypatch.setattr(verify_parallel, "cores", lambda: cores)
    budget = optimize.default_budget(None, "triton")
    assert budget.workers == workers
    assert budget.max_states == search.SearchBudget().max_states  # the search's own default otherwise
    assert _attention_budget(budget).workers == workers  # the decode attention's too


def test_the_torch_backend_searches_briefly_in_this_process_and_a_given_budget_is_kept(monkeypatch):
    monkeypatch.setattr(verify_parallel, "cores", lambda: 16)
    torch_budget = optimize.default_budget(None, "torch")
    assert torch_budget.workers == 1 and torch_budget.max_states == optimize.CPU_SEARCH_STATES
    given = search.SearchBudget(max_states=1234)
    assert optimize.default_budget(given, "triton") is given and optimize.default_budget(0, "triton") == 0
