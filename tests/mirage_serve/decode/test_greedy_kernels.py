"""The decode loop's two-launch greedy advance takes torch.argmax's token and does HF's bookkeeping."""
from __future__ import annotations

import pytest

from tests.interpreter import run_interpreted


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted("-m", "tests.mirage_serve.decode.greedy_interp_run")


def test_every_buffer_matches_the_torch_ops(interpreted):
    assert len(interpreted) == 3 * 3 * 5 * 2  # shapes × dtypes × kinds × (suppressed, not)
    wrong = {case: [k for k, same in got.items() if not same] for case, got in interpreted.items()
             if not all(got.values())}
    assert not wrong
