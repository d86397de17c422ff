"""Generated Triton kernels, run in Triton's CPU interpreter, match the float64 program (fp32, fp16)."""
from __future__ import annotations

import math

import pytest

from tests.interpreter import run_interpreted
from tests.superopt.codegen.triton_cases import CASES, CHAIN_CASES, INTERP_DTYPES, SUMMED_CASES

TOL = {"float32": 1e-5, "float16": 2e-3}  # docs/conventions.md tolerance table


@pytest.fixture(scope="module")
def interp_errors() -> dict:
    # one interpreter process for all cases: TRITON_INTERPRET must precede triton's import
    return run_interpreted("-m", "tests.superopt.codegen.triton_interp_run")


def _assert_close(interp_errors: dict, key: str, dtype: str) -> None:
    """The run ``key`` of the interpreter process (``triton_interp_run``) ran, and its relative error against the
    float64 program is within the dtype's tolerance."""
    err = interp_errors[key]
    assert not isinstance(err, str), err
    assert math.isfinite(err) and err <= TOL[dtype], f"{key}: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_interpreted_kernel_matches_float64(interp_errors, case, dtype):
    _assert_close(interp_errors, f"{case}/{dtype}", dtype)


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_prefetched_kernel_matches_float64(interp_errors, case, dtype):
    # loads issued one iteration ahead (a profiler launch variant): the same results
    _assert_close(interp_errors, f"{case}/{dtype}/prefetch", dtype)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_bound_call_gives_the_plain_calls_outputs(interp_errors, case):
    # CompiledGraph.bind (the patched sites' per-call path) with half the inputs fixed
    for dtype in INTERP_DTYPES:
        assert interp_errors[f"{case}/{dtype}/bound"] is True, interp_errors[f"{case}/{dtype}/bound"]


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_paired_launch_matches_float64_for_both_instances(interp_errors, case, dtype):
    # two instances (shared first input, their own other inputs) in one launch (PairedGraph)
    _assert_close(interp_errors, f"{case}/{dtype}/paired", dtype)


def test_site_pairing_takes_the_paired_launch_and_matches_the_separate_calls(interp_errors):
    # mirage_serve.patching.pairing.Pairing on two builds of a found k/v program, weights bound per instance
    assert interp_errors["site_pairing"] is True, interp_errors["site_pairing"]


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("case", CHAIN_CASES)
def test_chained_kernel_matches_float64(interp_errors, case, dtype):
    # the split kernel runs the combine in the last block of each group (ir.chain): one launch,
    # the same results; the bound call (a second launch) also checks that the counters were reset
    _assert_close(interp_errors, f"{case}/{dtype}/chain", dtype)
    assert interp_errors[f"{case}/{dtype}/chain/bound"] is True, interp_errors[f"{case}/{dtype}/chain/bound"]


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("case", SUMMED_CASES)
def test_ordered_cross_block_sums_match_float64(interp_errors, case, dtype):
    # each block stores its part in a slot of its own and the tile's last block adds the slots in order
    # (compile_graph(ordered_sums=True), as PatchOptions.deterministic asks); the slots start poisoned, and the
    # bound call is a second launch on them: nothing resets them, every launch writes each before it is read
    _assert_close(interp_errors, f"{case}/{dtype}/ordered", dtype)
    assert interp_errors[f"{case}/{dtype}/ordered/bound"] is True, interp_errors[f"{case}/{dtype}/ordered/bound"]


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("case", sorted(set(SUMMED_CASES) & set(CHAIN_CASES)))
def test_a_chained_split_k_producer_with_ordered_sums_matches_float64(interp_errors, case, dtype):
    _assert_close(interp_errors, f"{case}/{dtype}/chain_ordered", dtype)
