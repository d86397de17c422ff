"""Small norm / activation programs (issue 27) and their most fused searched μGraph, for the codegen tests."""
from __future__ import annotations

from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize

ROWS, HID, OUT = 3, 40, 24
BUDGET = SearchBudget(max_seconds=120, max_states=40_000, grid_dims=1, workers=1)


def program(case: str, dtype: str = "float32"):
    p = Program(case)
    x = p.input("x", (ROWS, HID), dtype)
    w = p.input("w", (HID, OUT), dtype)
    bias = p.input("bias", (OUT,), dtype)
    if case.startswith("ln_"):
        g, b = p.input("g", (HID,), dtype), p.input("b", (HID,), dtype)
        h = p.matmul(p.layer_norm(x, g, b), w)
        act = case[3:]
    else:
        h, act = p.matmul(x, w), case
    p.output(p.activation(act, p.add(h, bias)))
    return p.build()


def fused_graph(prog):
    """The verified μGraph with the fewest kernels the search finds for ``prog``."""
    r = superoptimize(prog, BUDGET)
    return min((g for g, _ in r.ranked), key=lambda g: g.num_kernels)


CASES = ("gelu", "gelu_pytorch_tanh", "relu", "relu2", "quick_gelu", "tanh", "ln_gelu")
