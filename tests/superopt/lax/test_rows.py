"""superopt.lax.rows.with_rows: a traced row-wise program re-typed for another rows count equals
the program traced at that count, and refuses where the rows count could hide in an attribute."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from superopt.ir import digest
from superopt.lax import Program
from superopt.lax.extract import extract
from superopt.lax.rows import RowsError, with_rows

from .test_extract import GeluGateUp, RMSNormLinear


def _rows_input(ex) -> str:
    return next(v.name for v, src in zip(ex.graph.inputs, ex.sources) if src[0] == "arg")


@pytest.mark.parametrize("module, d", [(RMSNormLinear(40, 24), 40), (GeluGateUp(24, 20), 24),
                                       (RMSNormLinear(40, 24, compute=torch.float64), 40)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_retyped_program_is_the_traced_one(module, d, m):
    base = extract(module, (torch.randn(7, d),), "p_m7")
    want = extract(module, (torch.randn(m, d),), f"p_m{m}")
    got = with_rows(base.graph, _rows_input(base), m, f"p_m{m}")
    assert got == want.graph and digest(got) == digest(want.graph)


def _program(build) -> tuple:
    p = Program("p_m4")
    x = p.input("x", (4, 6))
    w = p.input("w", (6, 5))
    p.output(build(p, x, w))
    return p.build()


@pytest.mark.parametrize("build", [
    lambda p, x, w: p.reshape(p.matmul(x, w), (2, 10)),           # the rows count spelled in a shape
    lambda p, x, w: p.slice(p.matmul(x, w), 0, 0, 2),             # a slice along the rows
    lambda p, x, w: p.concat([p.matmul(x, w), p.matmul(x, w)], 0),  # rows stacked
    lambda p, x, w: p.sum(p.matmul(x, w), 0),                      # rows reduced away: not row-wise
])
def test_refuses_what_inference_alone_cannot_retype(build):
    with pytest.raises(RowsError):
        with_rows(_program(build), "x", 2, "p_m2")


def test_an_unknown_rows_input_is_refused():
    with pytest.raises(RowsError, match="no input"):
        with_rows(_program(lambda p, x, w: p.matmul(x, w)), "y", 2, "p_m2")


class LinearResidual(torch.nn.Module):
    """o_proj with the decoder layer's residual add fused in: ``(x, r) -> r + x Wᵀ``."""

    def __init__(self, d, n):
        super().__init__()
        self.proj = torch.nn.Linear(d, n, bias=False)

    def forward(self, x, r):
        return r + self.proj(x)


@pytest.mark.parametrize("m", [1, 5])
def test_two_activations_are_retyped_together(m):
    module = LinearResidual(24, 20)
    base = extract(module, (torch.randn(7, 24), torch.randn(7, 20)), "p_m7")
    want = extract(module, (torch.randn(m, 24), torch.randn(m, 20)), f"p_m{m}")
    rows = [v.name for v, src in zip(base.graph.inputs, base.sources) if src[0] == "arg"]
    assert len(rows) == 2
    assert with_rows(base.graph, rows, m, f"p_m{m}") == want.graph
    with pytest.raises(RowsError):  # the residual left at 7 rows: the add cannot be re-typed
        with_rows(base.graph, rows[:1], m, f"p_m{m}")
