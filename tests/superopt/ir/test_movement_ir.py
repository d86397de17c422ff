"""Data-movement ops and block-input views in the IR: shape rules and their errors, the checker,
the text form, and one meaning in every Domain (float64, finite field, torch)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.field_domain import FieldDomain
from superopt.interp.movement import index_input
from superopt.interp.torch_domain import TorchDomain
from superopt.ir import GraphError, ShapeError, check, from_text, to_text
from superopt.lax import Program
from superopt.search import superoptimize
from superopt.verify.fields import default_field
from tests.fixtures import movement as mv


def test_shape_rules_name_what_is_wrong():
    p = Program("bad")
    x = p.input("x", (4, 6))
    pos = p.input("pos", (2,), "int64")
    with pytest.raises(ShapeError, match="not a permutation"):
        p.permute(x, (0, 0))
    with pytest.raises(ShapeError, match="1-D int64"):
        p.gather(x, x, 0)
    with pytest.raises(ShapeError, match="does not fit"):
        p.scatter(x, pos, p.input("src", (3, 6)), 0)
    with pytest.raises(ShapeError, match="positive integer"):
        p.repeat_interleave(x, 0, 1)
    assert p.gather(x, pos, 1).shape == (4, 2) and p.repeat_interleave(x, 3, 0).shape == (12, 6)


def _fused_mlp():
    return superoptimize(mv.phi3_mlp(m=3, d=73, inter=48)).best


def test_block_input_view_round_trips_and_is_checked():
    g = _fused_mlp()
    text = to_text(g)
    assert 'view(("slice",0,48,96))' in text
    assert from_text(text) == g
    node = g.customized_nodes()[0]
    i = next(k for k, inp in enumerate(node.block.inputs) if inp.view)
    for bad, msg in ((("slice", 0, 60, 120),), "out of range"), ((("roll", 0, 3),), "unknown view step"):
        inputs = list(node.block.inputs)
        inputs[i] = replace(inputs[i], view=bad)
        broken = replace(g, nodes=tuple(replace(n, block=replace(n.block, inputs=tuple(inputs)))
                                        if n is node else n for n in g.nodes))
        with pytest.raises(GraphError, match=msg):
            check(broken)


def _field_ints(x):
    return np.asarray(x.p, dtype=np.int64)


@pytest.mark.parametrize("build", [mv.rope, mv.cache_write, mv.gqa_scale])
def test_domains_agree_on_movement(build):
    g = build()
    rng = np.random.default_rng(3)
    vals = {}
    for v in g.inputs:
        if v.type.dtype == "int64":
            bound = min(g.type_of(n.args[0]).shape[n.attr("dim")] for n in g.nodes
                        if n.op in ("gather", "scatter") and n.args[1] == v.name)
            vals[v.name] = rng.permutation(bound)[:v.type.shape[0]]
        else:
            vals[v.name] = rng.integers(-50, 50, v.type.shape).astype(np.float64)  # exact in every domain
    ref = evaluate(g, vals, NumpyDomain())
    td = TorchDomain()
    tin = {k: (index_input(x, td) if x.dtype.kind == "i" else torch.from_numpy(x)) for k, x in vals.items()}
    for a, b in zip(ref, evaluate(g, tin, td)):
        assert np.array_equal(a, b.numpy())
    f = default_field()
    fd = FieldDomain(f.p, f.q, f.g, seed=1)
    fin = {}
    for k, x in vals.items():
        fin[k] = index_input(x, fd) if x.dtype.kind == "i" else index_input(np.mod(x.astype(np.int64), f.p), fd)
    for a, b in zip(ref, evaluate(g, fin, fd)):  # ring ops on small integers: exact in both
        assert np.array_equal(np.mod(a.astype(np.int64), f.p), _field_ints(b))
