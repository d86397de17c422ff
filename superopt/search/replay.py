"""The block search's first step: replay the program's own dataflow on a pattern's tiles.

Where the tiling lets every op run as written this is the direct fusion, found in a few states.
Two rewrites that every for-loop pattern needs are applied on the way, so the rounds after it
need not discover them by enumeration:

* a sum over the looped index is a tile sum plus ``accum_sum``: a replayed op whose result
  falls short of the program value by the loop part is accumulated;
* a division of a loop-variant value by a finished sum, ``(a / b)`` with b after the loop, is
  deferred: the ops that follow apply to a while they are linear in it (cast, mul, matmul,
  reduce_sum), and once the loop index is summed the division comes after the loop,
  Σ_l (a_l / b)·x_l = (Σ_l a_l·x_l) / b — flash attention's order, found for any program.

Values are matched to program values by normal form, labels and dtype (a cast changes no normal
form: q.float() is not q). Constants keep the program's order here ((s·scale)/softcap).
Under the precision ablation (``SearchBudget.keep_precision=False``, no ``PrecisionFloor``) values are
matched by normal form and labels only: the first equal value, whatever its dtype, as the rounds would.
"""
from __future__ import annotations

LINEAR = ("cast", "mul", "matmul", "reduce_sum")  # linear in each operand: a pending division passes
LOOP, POST = "loop", "post"  # a block value's variance (block.py; that module imports this one)


def replay(bs, program, env: dict[str, int], labels: dict[str, tuple]) -> None:
    by_key: dict[tuple, int] = {}
    for i, v in enumerate(bs.vals):
        _index(by_key, v, i)
    pending: dict[str, tuple[int, int]] = {}   # program value -> (numerator, divisor) block values

    def find(a):
        if bs.precision is None:  # the precision ablation: a cast is a value identity, any dtype will do
            return by_key.get((env[a], labels[a]))
        return by_key.get((env[a], labels[a], program.type_of(a).dtype), by_key.get((env[a], labels[a])))

    bs._replaying = True
    try:
        for n in program.nodes:
            if n.op == "const":
                continue
            held = [a for a in n.args if a in pending]
            if held:
                if len(held) == 1 and n.op in LINEAR and bs.pattern.loop >= 0:
                    _through(bs, n, held[0], find, pending, by_key, env, labels)
                continue
            args = [find(a) for a in n.args]
            if None in args:
                continue
            i = _apply(bs, n.op, tuple(args), n.attrs, by_key)
            if i is None:
                if n.op == "div" and bs.vals[args[0]].var == LOOP and bs.vals[args[1]].var == POST:
                    pending[n.out.name] = (args[0], args[1])
                continue
            if bs.vals[i].expr != env[n.out.name] and bs.vals[i].var == LOOP:
                _apply(bs, "accum_sum", (i,), (), by_key)
    finally:
        bs._replaying = False


def _through(bs, n, held: str, find, pending, by_key, env, labels) -> None:
    """Apply ``n`` to the pending numerator; after the loop index is summed, divide."""
    num, div = pending[held]
    args = [num if a == held else find(a) for a in n.args]
    if None in args:
        return
    i = _apply(bs, n.op, tuple(args), n.attrs, by_key)
    if i is None:
        return
    v = bs.vals[i]
    if v.var != LOOP or bs.pattern.loop in labels[n.out.name]:
        pending[n.out.name] = (i, div)
        return
    acc = _apply(bs, "accum_sum", (i,), (), by_key)
    if acc is None:
        return
    d = div
    if bs.vals[d].type.dtype != bs.vals[acc].type.dtype:
        d = _apply(bs, "cast", (d,), (("dtype", bs.vals[acc].type.dtype),), by_key)
        if d is None:
            return
    _apply(bs, "div", (acc, d), (), by_key)


def _apply(bs, op: str, args: tuple, attrs: tuple, by_key: dict) -> int | None:
    """The block value ``op(args)`` — new, or the equal one already found — or None if pruned."""
    before = len(bs.vals)
    bs.last_duplicate = None
    bs._try(op, args, attrs)
    if len(bs.vals) > before:
        _index(by_key, bs.vals[before], before)
        return before
    return bs.last_duplicate


def _index(by_key: dict, v, i: int) -> None:
    by_key.setdefault((v.expr, v.labels, v.type.dtype), i)
    by_key.setdefault((v.expr, v.labels), i)
