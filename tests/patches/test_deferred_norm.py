"""A norm site's norm is deferred (patching.install): its output is a placeholder that is filled only
when something other than the hand-off needs it, and never deferred while a hook could see it."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from mirage_serve.patching.prepare import PartsRuntime
from mirage_serve.patching.install import install, restore
from mirage_serve.patching.sites import Consumer, NormSite, SiteModule, site_parts


class Direct:
    """A SiteRuntime stand-in that runs (a copy of) one part's modules and counts its calls."""

    def __init__(self, module):
        self.module, self.dim, self.dtype, self.device, self.kernels = copy.deepcopy(module), 12, torch.float32, "cpu", {4: None}
        self.calls = 0

    def run(self, x):
        self.calls += 1
        return list(self.module(x))

    def eligible(self, module, x):
        return x.shape[-1] == self.dim and x.numel() // self.dim <= 4


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(12)
        self.a = nn.Linear(12, 5)
        self.b = nn.Linear(12, 7)


def _patched(like_input=True):
    torch.manual_seed(0)
    layer = Layer()
    with torch.no_grad():
        layer.norm.weight.uniform_(0.5, 1.5)
    site = NormSite("attn_in", "norm", (Consumer("a"), Consumer("b")))
    parts = site_parts(site.name, SiteModule(layer.norm, [layer.a, layer.b]))
    rt = PartsRuntime([(Direct(m), outs) for _, m, outs in parts])
    rt.norm_like_input = like_input
    records = []
    reference = {k: (v.forward if "forward" in v.__dict__ else None) for k, v in layer.named_children()}
    want = _reference(copy.deepcopy(layer))  # the unpatched layer's outputs
    install(layer, site, rt, records)
    return layer, rt, records, want, reference


def _reference(layer):
    def call(x):
        n = layer.norm(x)
        return n, layer.a(n), layer.b(n)
    return call


def test_consumers_get_their_outputs_and_the_norm_kernel_does_not_run():
    layer, rt, _, want, _ = _patched()
    x = torch.randn(3, 12)
    n = layer.norm(x)
    ya, yb = layer.a(n), layer.b(n)
    _, wa, wb = want(x)
    assert torch.allclose(ya, wa, atol=1e-6) and torch.allclose(yb, wb, atol=1e-6)
    assert rt.norm_part.calls == 0


def test_a_fallback_with_the_placeholder_or_a_view_of_it_fills_it_first():
    layer, rt, _, want, _ = _patched()
    x = torch.randn(2, 12)
    wn, wa, _ = want(x)
    n = layer.norm(x)
    layer.a(n), layer.b(n)  # the hand-off is used up: the next calls run the original forwards
    again = layer.a(n[:1])  # a view of the placeholder
    assert rt.norm_part.calls == 1
    assert torch.allclose(n, wn, atol=1e-6)
    assert torch.allclose(again, wa[:1], atol=1e-6)


@pytest.mark.parametrize("where", ["norm", "a", "global"])
def test_nothing_is_deferred_while_a_hook_could_read_the_norm_output(where):
    layer, rt, _, want, _ = _patched()
    seen = []
    if where == "global":
        handle = nn.modules.module.register_module_forward_pre_hook(lambda m, args: None)
    elif where == "norm":
        handle = layer.norm.register_forward_hook(lambda m, args, out: seen.append(out.clone()))
    else:
        handle = layer.a.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        x = torch.randn(3, 12)
        n = layer.norm(x)
        layer.a(n), layer.b(n)
    finally:
        handle.remove()
    assert rt.norm_part.calls == 1
    assert torch.allclose(n, want(x)[0], atol=1e-6)
    for s in seen:
        assert torch.allclose(s, want(x)[0], atol=1e-6)


def test_a_norm_output_unlike_its_input_is_computed_and_restore_undoes_everything():
    layer, rt, records, want, reference = _patched(like_input=False)
    x = torch.randn(4, 12)
    n = layer.norm(x)
    assert rt.norm_part.calls == 1 and torch.allclose(n, want(x)[0], atol=1e-6)
    restore(records)
    assert {k: (v.forward if "forward" in v.__dict__ else None) for k, v in layer.named_children()} == reference
