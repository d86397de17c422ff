"""patching.stacking and site_parts(stack=True): q/k/v as one projection on one shared weight."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mirage_serve.patching.prepare import PartsRuntime
from mirage_serve.patching.sites import SiteModule, site_parts, stacked_widths
from mirage_serve.patching.stacking import stack_linears, stackable


class _Gated(nn.Module):  # a block consumer (the MLP up to its down projection): never stacked
    def __init__(self, d: int):
        super().__init__()
        self.gate, self.up = nn.Linear(d, 5, bias=False), nn.Linear(d, 5, bias=False)

    def forward(self, n):
        return torch.nn.functional.silu(self.gate(n)) * self.up(n)


def _site(bias: bool, dtype=torch.float64):
    torch.manual_seed(0)
    d = 12
    cons = [nn.Linear(d, 8, bias=bias), nn.Linear(d, 3, bias=bias), _Gated(d), nn.Linear(d, 3, bias=bias)]
    return SiteModule(nn.LayerNorm(d), cons).to(dtype), d


@pytest.mark.parametrize("bias", [False, True])
def test_linear_consumers_are_one_part_whose_split_output_is_theirs_and_nothing_is_copied(bias):
    site, d = _site(bias)
    x = torch.randn(5, d, dtype=torch.float64)
    with torch.no_grad():
        want = site(x)
    params = [p for c in site.consumers if type(c) is nn.Linear for p in c.parameters()]
    nbytes = sum(p.numel() * p.element_size() for p in params)

    parts = site_parts("attn_in", site, stack=True)
    # the three Linears at the first one's place, the block consumer apart, the norm last
    assert [(n, o) for n, _, o in parts] == [("attn_in", (1, 2, 4)), ("attn_in_1", (3,)), ("norm", (0,))]
    stacked = parts[0][1].consumers[0]
    assert type(stacked) is nn.Linear and stacked.weight.shape == (14, d)
    assert stacked_widths(site, parts[0][2]) == (8, 3, 3) and stacked_widths(site, (3,)) == ()
    # the consumers' weights (and biases) now view the stacked ones: one storage of the same size
    for p in params:
        assert p.untyped_storage().data_ptr() == stacked.weight.untyped_storage().data_ptr() or \
            p.untyped_storage().data_ptr() == stacked.bias.untyped_storage().data_ptr()
    assert sum(t.untyped_storage().nbytes() for t in stacked.parameters()) == nbytes

    class Direct:  # a SiteRuntime stand-in: the part's module, a stacked output split as BucketKernel.splits does
        def __init__(self, module, widths):
            self.module, self.widths = module, widths
            self.dim, self.dtype, self.device, self.kernels = d, torch.float64, "cpu", {1: None}

        def run(self, x):
            outs = list(self.module(x))
            return list(outs[0].split(self.widths, -1)) if self.widths else outs

    rt = PartsRuntime([(Direct(m, stacked_widths(site, outs)), outs) for _, m, outs in parts])
    with torch.no_grad():
        got = rt.run(x)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)  # one GEMM: another summation order
        assert torch.equal(site(x)[1], want[1])  # the original modules, on the views, as before

    again = site_parts("attn_in", site, stack=True)[0][1].consumers[0]  # a second trace: views, no new copy
    assert again.weight.data_ptr() == stacked.weight.data_ptr() and torch.equal(again.weight, stacked.weight)


def test_without_stack_every_consumer_is_its_own_part():
    site, _ = _site(bias=False)
    ptr = site.consumers[0].weight.data_ptr()
    assert [o for _, _, o in site_parts("attn_in", site)] == [(1,), (2,), (3,), (4,), (0,)]
    assert site.consumers[0].weight.data_ptr() == ptr


class _Subclass(nn.Linear):  # a quantized / foreign linear stands in
    pass


@pytest.mark.parametrize("why", ["one", "dtype", "bias", "in_features", "subclass", "meta"])
def test_consumers_that_cannot_share_one_weight_are_not_stacked(why):
    a, b = nn.Linear(8, 4), nn.Linear(8, 4)
    if why == "dtype":
        b = b.to(torch.float16)
    elif why == "bias":
        b = nn.Linear(8, 4, bias=False)
    elif why == "in_features":
        b = nn.Linear(6, 4)
    elif why == "subclass":
        b = _Subclass(8, 4)
    elif why == "meta":
        b = nn.Linear(8, 4, device="meta")
    mods = [a] if why == "one" else [a, b]
    assert not stackable(mods)
    assert stackable([nn.Linear(8, 4), nn.Linear(8, 2)])


def test_a_stacked_projection_takes_no_gradient_and_its_weight_holds_the_values():
    a, b = nn.Linear(8, 4), nn.Linear(8, 2)
    wa, wb = a.weight.detach().clone(), b.weight.detach().clone()
    s = stack_linears([a, b])
    assert not s.weight.requires_grad and torch.equal(s.weight, torch.cat([wa, wb]))
    assert a.weight.requires_grad and torch.equal(a.weight, wa) and torch.equal(b.weight, wb)
