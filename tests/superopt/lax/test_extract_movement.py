"""Extraction of data movement from small torch modules (odd shapes): HF's split of a fused qkv,
chunk of gate_up, repeat_kv, any-dims transpose / permute, RoPE with cos / sin gathered at the
position, and StaticCache's in-place index_copy_ (an extra output). Each extracted program,
evaluated in float64, matches the module run in float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from superopt.interp import NumpyDomain, evaluate
from superopt.lax.extract import extract


class QKVSplit(torch.nn.Module):
    def __init__(self, d=73, q=48, kv=16):
        super().__init__()
        self.q, self.kv = q, kv
        self.qkv_proj = torch.nn.Linear(d, q + 2 * kv, bias=False)

    def forward(self, x):
        qkv = self.qkv_proj(x)
        return qkv[..., :self.q], qkv[..., self.q:self.q + self.kv], qkv[..., self.q + self.kv:]


class GateUpChunk(torch.nn.Module):
    def __init__(self, d=96, inter=37):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(d, 2 * inter, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return up * torch.nn.functional.silu(gate)


class RepeatKV(torch.nn.Module):  # transformers' repeat_kv
    def forward(self, k):
        b, kv, s, d = k.shape
        return k[:, :, None, :, :].expand(b, kv, 3, s, d).reshape(b, kv * 3, s, d)


class Heads(torch.nn.Module):  # view to heads, transpose(1, 2), a permute, repeat_interleave
    def forward(self, x):
        h = x.view(2, 5, 3, 7).transpose(1, 2)
        return h.permute(0, 3, 1, 2).repeat_interleave(2, dim=1)


class Rope(torch.nn.Module):  # apply_rotary_pos_emb on one tensor, cos / sin tables indexed by position
    def forward(self, q, cos_t, sin_t, pos):
        cos, sin = cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)
        half = q.shape[-1] // 2
        rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rot * sin


class CacheWrite(torch.nn.Module):  # StaticCache.update: index_copy_ into a buffer, then read it
    def __init__(self):
        super().__init__()
        self.register_buffer("keys", torch.randn(1, 3, 13, 6))

    def forward(self, k, q, pos):
        self.keys.index_copy_(2, pos, k)
        return q @ self.keys.transpose(2, 3)


CASES = {
    "qkv_split": (QKVSplit, lambda: (torch.randn(3, 1, 73),)),
    "gate_up_chunk": (GateUpChunk, lambda: (torch.randn(1, 1, 96),)),
    "repeat_kv": (RepeatKV, lambda: (torch.randn(2, 3, 5, 4),)),
    "heads": (Heads, lambda: (torch.randn(2, 5, 21),)),
    "rope": (Rope, lambda: (torch.randn(1, 3, 1, 10), torch.randn(17, 10), torch.randn(17, 10),
                            torch.tensor([11]))),
    "cache_write": (CacheWrite, lambda: (torch.randn(1, 3, 1, 6), torch.randn(1, 3, 1, 6), torch.tensor([9]))),
}


def _numpy(t: torch.Tensor):
    return t.numpy() if t.dtype == torch.int64 else t.double().numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_extracted_program_matches_module(case):
    torch.manual_seed(0)
    cls, make = CASES[case]
    module = cls().eval()
    args = make()
    state = {k: v.detach().clone() for k, v in list(module.named_parameters()) + list(module.named_buffers())}
    ex = extract(module, args, name=case)
    inputs = []
    for (kind, where) in ex.sources:
        inputs.append(_numpy(args[where]) if kind == "arg" else _numpy(state[where]))
    got = evaluate(ex.graph, inputs, NumpyDomain())
    module64 = cls().double().eval()
    module64.load_state_dict({k: v.double() for k, v in state.items()})
    with torch.no_grad():
        want = module64(*[a.double() if a.is_floating_point() else a for a in args])
    want = list(want) if isinstance(want, tuple) else [want]
    if case == "cache_write":  # the written cache is the program's extra output
        want.append(module64.keys)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.numpy()
        assert g.shape == w.shape
        assert np.max(np.abs(g - w)) <= 1e-12 * max(1.0, np.max(np.abs(w)))


def test_movement_ops_in_the_extracted_programs():
    ops = {}
    for case, (cls, make) in CASES.items():
        ops[case] = {n.op for n in extract(cls().eval(), make(), name=case).graph.nodes}
    assert "slice" in ops["qkv_split"] and "slice" in ops["gate_up_chunk"]
    assert "repeat" in ops["repeat_kv"] and {"permute", "repeat"} <= ops["heads"]
    assert {"gather", "concat", "neg"} <= ops["rope"]
    assert "scatter" in ops["cache_write"]
