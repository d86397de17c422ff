"""superopt.lax.extract: programs traced from torch modules compute what the modules compute."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.torch_domain import TorchDomain
from superopt.lax.extract import ExtractError, extract


class RMSNormLinear(nn.Module):
    """Llama's RMSNorm written out (fp32 compute, cast back) feeding a biased projection."""

    def __init__(self, d: int, n: int, eps: float = 1e-6, compute: torch.dtype = torch.float32):
        super().__init__()
        self.compute = compute
        self.weight = nn.Parameter(torch.randn(d) * 0.1 + 1)
        self.proj = nn.Linear(d, n, bias=True)
        self.eps = eps

    def forward(self, x):
        h = x.to(self.compute)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        n = self.weight * h.to(x.dtype)
        return n, self.proj(n)


class GeluGateUp(nn.Module):
    """Phi-3 style fused gate/up projection, chunked, with Gemma's GELU-tanh on the gate."""

    def __init__(self, d: int, f: int):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * f, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return (nn.functional.gelu(gate, approximate="tanh") * up,)


def _inputs(ex, module, x):
    return [x if kind == "arg" else module.get_parameter(path) for kind, path in ex.sources]


def test_rmsnorm_linear_matches_float64_reference():
    torch.manual_seed(0)
    m = RMSNormLinear(73, 45, compute=torch.float64).double()
    x = torch.randn(3, 73, dtype=torch.float64)
    ex = extract(m, (x,), "rms_proj")
    assert [t.shape for t in ex.graph.output_types] == [(3, 73), (3, 45)]
    assert ("parameter", "proj.bias") in ex.sources and ("arg", 0) in ex.sources
    got = evaluate(ex.graph, [t.detach().numpy() for t in _inputs(ex, m, x)], NumpyDomain())
    with torch.no_grad():
        want = m(x)
    for g, w in zip(got, want):
        assert np.linalg.norm(g - w.numpy()) / np.linalg.norm(w.numpy()) < 1e-12


def test_bf16_casts_follow_torch_type_promotion():
    torch.manual_seed(1)
    m = RMSNormLinear(40, 24).to(torch.bfloat16)
    x = torch.randn(5, 40).to(torch.bfloat16)
    ex = extract(m, (x,))
    ops = [n.op for n in ex.graph.nodes]
    assert "cast" in ops  # fp32 statistics, cast back to bf16 before the weight
    got = evaluate(ex.graph, _inputs(ex, m, x), TorchDomain())
    with torch.no_grad():
        want = m(x)
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        assert ((g.float() - w.float()).norm() / w.float().norm()).item() < 1e-2


def test_chunk_and_gelu_tanh():
    torch.manual_seed(2)
    m = GeluGateUp(33, 19)
    x = torch.randn(4, 33)
    ex = extract(m, (x,))
    assert {"slice", "gelu_tanh"} <= {n.op for n in ex.graph.nodes}
    (got,) = evaluate(ex.graph, _inputs(ex, m, x), TorchDomain())
    with torch.no_grad():
        (want,) = m(x)
    assert ((got - want).norm() / want.norm()).item() < 1e-6


def test_unknown_aten_op_is_named():
    class Sine(nn.Module):
        def forward(self, x):
            return (torch.sin(x) * 2.0,)

    with pytest.raises(ExtractError, match=r"aten\.sin\.default"):
        extract(Sine(), (torch.randn(2, 7),))


def test_exact_gelu_extracts_as_the_erf_form():
    """nn.functional.gelu (erf form) was refused before issue 27; now it is the op ``gelu``."""
    class Gelu(nn.Module):
        def forward(self, x):
            return (nn.functional.gelu(x),)

    x = torch.randn(2, 7, dtype=torch.float64)
    ex = extract(Gelu(), (x,))
    assert [n.op for n in ex.graph.nodes] == ["gelu"]
    (got,) = evaluate(ex.graph, [x.numpy()], NumpyDomain())
    want = nn.functional.gelu(x).numpy()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-12
