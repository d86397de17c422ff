"""SearchResult.candidates: the best designs plus each at other extents, all equivalent to the program."""
from __future__ import annotations

from superopt.lax import Program
from superopt.search import superoptimize
from superopt.verify import check_equivalent
from tests.fixtures.budget import states_budget


def test_candidates_are_other_extents_of_verified_designs():
    p = Program("down_proj")
    x = p.input("x", (1, 1216), "bfloat16")
    w = p.input("w", (448, 1216), "bfloat16")
    p.output(p.matmul(x, p.transpose(w)))
    program = p.build()
    result = superoptimize(program, states_budget())
    cands = result.candidates()
    shapes = {tuple((n.block.num_blocks, n.block.forloop) for n in g.customized_nodes()) for g in cands}
    assert len(shapes) == len(cands) > 3  # distinct instantiations, not copies
    assert cands[0] is result.best
    for g in cands:
        assert g.output_types == program.output_types
        v = check_equivalent(program, g)
        assert v.equivalent, (g, v)
