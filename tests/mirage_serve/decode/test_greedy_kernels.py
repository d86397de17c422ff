"""The decode loop's two-launch greedy advance takes torch.argmax's token, does HF's bookkeeping and sets up the
next step; the loop that runs it (in Triton's interpreter) returns HF's tokens."""
from __future__ import annotations

import pytest
import torch

from tests.interpreter import run_interpreted

from .greedy_interp_run import compare


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted("-m", "tests.mirage_serve.decode.greedy_interp_run")


def _wrong(results: dict) -> dict:
    assert len(results) == 3 * 3 * 5 * 2  # shapes × dtypes × kinds × (suppressed, not)
    return {case: [k for k, same in got.items() if not same] for case, got in results.items() if not all(got.values())}


def test_every_buffer_matches_the_torch_ops(interpreted):
    assert not _wrong(interpreted["kernels"])


def test_the_loop_that_runs_them_returns_hf_tokens(interpreted):
    loop = interpreted["loop"]
    assert loop["greedy_kernels"] and loop["fast"] == 2, loop  # the kernels ran, in the loop, for both calls
    assert loop["same"] == [True, True], loop
    assert set(loop["adopted"]) == {True}, loop  # the steps read the mask the kernel's columns made
    assert set(loop["embeds_passed"]) == {True}, loop  # and the embedding rows the kernel wrote
    assert set(loop["rotary_folded"]) == {True}, loop  # and the rotary rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_every_buffer_matches_the_torch_ops():
    assert not _wrong(compare("cuda"))
