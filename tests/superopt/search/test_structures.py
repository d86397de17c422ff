"""A search result's structures through JSON: another process re-instantiates them at another shape."""
from __future__ import annotations

import json

import pytest

from superopt.ir import to_text
from superopt.lax.attention import decode_layer_attention_program
from superopt.search import SearchBudget, superoptimize
from superopt.search.structures import from_json, to_json

BUDGET = SearchBudget(max_states=200_000, workers=1)


def _program(kv_len: int, batch: int = 1):
    return decode_layer_attention_program(batch, 4, 2, 16, kv_len, dtype="float32")


def test_structures_read_back_reinstantiate_what_the_result_itself_does():
    result = superoptimize(_program(48), BUDGET)
    stored = json.loads(json.dumps(to_json(result)))        # what a cache entry's meta keeps
    other = _program(80, batch=3)                           # another capacity and batch
    want = result.reinstantiate(other)
    got = from_json(stored, BUDGET, "sm_90").reinstantiate(other)
    assert got.best is not other and got.best.num_kernels >= 1   # a fused design, not the program
    assert [to_text(g) for g, _ in got.ranked] == [to_text(g) for g, _ in want.ranked]
    assert got.best.inputs == other.inputs


@pytest.mark.parametrize("bad", [{}, {"designs": 3}, {"inner": {"designs": []}}, {"designs": [[{"x": 1}]]}])
def test_anything_else_is_refused(bad):
    with pytest.raises(ValueError, match="structures"):
        from_json(bad, BUDGET, "sm_90")
