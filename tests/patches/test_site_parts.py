"""sites.site_parts and PartsRuntime: a norm site as several programs, outputs back in site order."""
from __future__ import annotations

import torch
from torch import nn

from mirage_serve.patching.prepare import PartsRuntime
from mirage_serve.patching.sites import SiteModule, site_parts


def test_one_part_per_consumer_equal_ones_share_a_name_and_outputs_reassembled_in_order():
    torch.manual_seed(0)
    norm = nn.LayerNorm(12)
    cons = [nn.Linear(12, 4), nn.Linear(12, 6), nn.Linear(12, 4), nn.Linear(12, 6)]
    site = SiteModule(norm, cons)
    parts = site_parts("attn_in", site)
    # consumers of equal structure (the two 12->4 and the two 12->6 linears) are one program each
    assert [(n, o) for n, _, o in parts] == [("attn_in", (1,)), ("attn_in_1", (2,)), ("attn_in", (3,)),
                                            ("attn_in_1", (4,)), ("norm", (0,))]

    class Direct:  # a SiteRuntime stand-in that runs the part's module
        def __init__(self, module):
            self.module, self.dim, self.dtype, self.device, self.kernels = module, 12, torch.float32, "cpu", {1: None}

        def run(self, x):
            return list(self.module(x))

    rt = PartsRuntime([(Direct(m), outs) for _, m, outs in parts])
    x = torch.randn(3, 12)
    for got, want in zip(rt.run(x), site(x), strict=True):
        assert torch.equal(got, want)
