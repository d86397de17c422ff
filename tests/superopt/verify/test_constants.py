"""The value checks see a constant's rounding (``verify.constants``): a narrowing cast of a
constant, or a 16-bit const, is the value its dtype holds — compared with torch's own rounding — and
a graph that differs from the program only by such a rounding is not equivalent."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from superopt.ir import check, from_text
from superopt.verify import check_equivalent
from superopt.verify.constants import held_constants, round_to

_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@pytest.mark.parametrize("dtype", sorted(_TORCH))
def test_round_to_is_torchs_rounding(dtype):
    rng = np.random.default_rng(7)
    values = list(rng.standard_normal(300) * 10.0 ** rng.integers(-8, 5, 300)) + [1 / 2304, 1e-6, 1 / 896, 1e-5]
    for v in values:
        assert round_to(float(v), dtype) == torch.tensor(float(v), dtype=torch.float64).to(_TORCH[dtype]).item(), v


# x · (1/73) in fp32 against the same with the constant cast down and back up
PROGRAM = """graph scale
input %x : float32[5,73]
%c = const() [dtype="float32", value=73.0] : float32[]
%y = div(%x, %c) : float32[5,73]
output %y
"""
NARROWED = """graph scale_narrowed
input %x : float32[5,73]
%one = const() [dtype="float32", value=1.0] : float32[]
%c = const() [dtype="float32", value=73.0] : float32[]
%r = div(%one, %c) : float32[]
%n = cast(%r) [dtype="DT"] : DT[]
%w = cast(%n) [dtype="float32"] : float32[]
%y = mul(%x, %w) : float32[5,73]
output %y
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_constant_rounded_by_its_cast_is_not_the_programs_constant(dtype):
    program, narrowed = check(from_text(PROGRAM)), check(from_text(NARROWED.replace("DT", dtype)))
    v = check_equivalent(program, narrowed)
    assert not v.equivalent and "differs" in v.reason, v
    folded = held_constants(narrowed)
    assert [n.op for n in folded.nodes][3] == "const"
    assert folded.nodes[3].attr("value") == round_to(1 / 73, dtype) != 1 / 73


def test_an_exact_or_widening_cast_of_a_constant_changes_nothing():
    program = check(from_text(PROGRAM.replace("73.0", "64.0").replace("73]", "64]")))
    exact = check(from_text(NARROWED.replace("DT", "bfloat16").replace("73.0", "64.0").replace("73]", "64]")))
    assert held_constants(exact) is exact and held_constants(program) is program   # 1/64 is a bf16
    assert check_equivalent(program, exact).equivalent
