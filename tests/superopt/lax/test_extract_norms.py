"""Extraction of HF-style LayerNorm, Gemma RMSNorm (1 + w) and ACT2FN activations (issue 27)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from superopt.interp import NumpyDomain, evaluate
from superopt.lax import Program
from superopt.lax.activations import ACT_NAMES, ACT_NOT_COVERED
from superopt.lax.extract import extract


class LNUpGelu(nn.Module):
    """GPT-NeoX's MLP input: LayerNorm(w, b) → dense_h_to_4h (+ bias) → GELU."""

    def __init__(self, d, f, approximate="none"):
        super().__init__()
        self.ln = nn.LayerNorm(d, eps=1e-5)
        with torch.no_grad():
            self.ln.weight.normal_(1.0, 0.1)
            self.ln.bias.normal_(0.0, 0.1)
        self.up = nn.Linear(d, f)
        self.approximate = approximate

    def forward(self, x):
        return (nn.functional.gelu(self.up(self.ln(x)), approximate=self.approximate),)


class GemmaNormNewGelu(nn.Module):
    """Gemma's RMSNorm (fp32, (1 + w)) then HF's NewGELU written out with torch.pow(x, 3)."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = (h * (1.0 + self.weight.float())).type_as(x)
        return (0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0)))),)


class Relu2Softcap(nn.Module):
    def forward(self, x):
        return (torch.tanh(torch.square(torch.relu(x)) / 30.0) * 30.0,)


def _check(module, x, ops, tol=1e-12):
    ex = extract(module, (x,))
    names = {n.op for n in ex.graph.nodes}
    assert ops <= names, names
    ins = [x if kind == "arg" else module.get_parameter(path) for kind, path in ex.sources]
    got = evaluate(ex.graph, [t.detach().double().numpy() for t in ins], NumpyDomain())
    with torch.no_grad():
        want = module.double()(x.double())
    for g, w in zip(got, want):
        assert np.linalg.norm(g - w.numpy()) / np.linalg.norm(w.numpy()) < tol


@pytest.mark.parametrize("approximate,op", [("none", "gelu"), ("tanh", "gelu_tanh")])
def test_layernorm_linear_gelu_extracts(approximate, op):
    torch.manual_seed(0)
    _check(LNUpGelu(73, 45, approximate).double(), torch.randn(3, 73, dtype=torch.float64), {"rsqrt", op})


def test_gemma_norm_and_written_new_gelu_extract():
    torch.manual_seed(1)
    # the module's x.float() rounds to fp32 even in a float64 model; the interpreter's casts do not
    _check(GemmaNormNewGelu(48).double(), torch.randn(5, 48, dtype=torch.float64), {"rsqrt", "tanh"}, tol=1e-5)


def test_relu2_and_softcap_extract():
    _check(Relu2Softcap(), torch.randn(4, 9, dtype=torch.float64), {"relu", "tanh"})


def test_act2fn_names_match_transformers():
    """Every covered name computes what transformers' ACT2FN computes (float64), every other is named."""
    from transformers.activations import ACT2FN
    x = torch.randn(3, 11, dtype=torch.float64) * 2
    for name in ACT_NAMES:
        p = Program(name)
        xi = p.input("x", (3, 11), "float64")
        p.output(p.activation(name, xi))
        (got,) = evaluate(p.build(), [x.numpy()], NumpyDomain())
        want = ACT2FN[name](x).numpy()
        assert np.linalg.norm(got - want) <= 1e-12 * np.linalg.norm(want), name
    assert set(ACT2FN) <= set(ACT_NAMES) | set(ACT_NOT_COVERED), set(ACT2FN) - set(ACT_NAMES) - set(ACT_NOT_COVERED)
    with pytest.raises(ValueError, match="mish"):
        Program("m").activation("mish", Program("m").input("x", (2,)))
