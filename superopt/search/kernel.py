"""Kernel-level search: which tiling patterns to try, and one pattern's search (one or two kernels).

Patterns come from the program's index analysis, never from a per-benchmark template:

* a *single* fused kernel: grid axes partition indices that every output carries (a block must
  see all of a reduction it finishes), the for-loop walks one reduction index or none;
* a *split* kernel plus a combine kernel (flash-decoding): one grid axis partitions a reduction
  index ``r`` and the blocks' partial results are summed across blocks. The split kernel must
  produce the *frontier* of ``r`` — the outermost sums over ``r`` in the target, e.g. Σ_L e^s·v
  and Σ_L e^s for attention — and a second kernel computes the target from them, searched like
  a single kernel on the target with the frontier replaced by those tensors.

Which program inputs a kernel reads is decided by the target: exactly the inputs its normal form
mentions (Mirage hard-codes "all three tensors or the last two").
"""
from __future__ import annotations

from fractions import Fraction
from itertools import combinations

from ..abstract import ALL, NFStore, ProgramIndex, SubexprOracle, program_exprs
from ..ir import KernelGraph, TensorType
from ..ir.ops import BINARY_OPS, UNARY_OPS
from .block import BlockSearch, Goal, Source
from .budget import SearchBudget
from .precision import PrecisionFloor, widen_partials
from .skeleton import Pattern, retarget


def vocabulary(program: KernelGraph) -> dict:
    ops = {n.op for n in program.nodes}
    binary = sorted(ops & BINARY_OPS) + (["matmul"] if "matmul" in ops else [])
    return {"unary": sorted(ops & UNARY_OPS), "binary": binary,
            "reduce": sorted({n.attr("keepdim") for n in program.nodes if n.op == "reduce_sum"}),
            "transpose": "transpose" in ops,
            "cast": sorted({n.attr("dtype") for n in program.nodes if n.op == "cast"})}


def nontrivial(pattern: Pattern) -> dict[int, frozenset]:
    parts: dict[int, set] = {}
    for idx in pattern.grid:
        parts.setdefault(idx, {"t"}).add("g")
    if pattern.loop >= 0:
        parts.setdefault(pattern.loop, {"t"}).add("l")
    return {k: frozenset(v) for k, v in parts.items()}


def representative(pattern: Pattern, sizes: dict[int, int]) -> tuple[tuple[int, int, int], int] | None:
    """Smallest grid / loop extents ≥ 2 that leave tiles of ≥ 2 (None if the shape forbids the pattern).

    An output index the grid partitions may be cut to tiles of one (extent = its size): the block
    search never sees it (``skeleton.search_key``), so a tile of one cannot blur it there, and a
    block per head is how decode attention serves Qwen2.5-0.5B's 2 kv heads (each block with the
    7 q heads of its kv head, ``benchmarks/results/fixture_gap_attention_cpu_2026-11-26.md``)."""
    grid = [1, 1, 1]
    forloop = 1
    for a, idx in enumerate(pattern.grid):
        s = sizes[idx]
        need = 4 if idx == pattern.loop else 2 if idx == pattern.split else 1
        g = next((g for g in range(2, s + 1) if s % g == 0 and s // g >= need and
                  (idx != pattern.loop or _div_ge2(s // g))), None)
        if g is None:
            return None
        grid[a] = g
    if pattern.loop >= 0:
        s = sizes[pattern.loop]
        if pattern.loop in pattern.grid:
            s //= grid[pattern.grid.index(pattern.loop)]
        f = _div_ge2(s)
        if f is None:
            return None
        forloop = f
    return (grid[0], grid[1], grid[2]), forloop


def _div_ge2(s: int) -> int | None:
    return next((f for f in range(2, s + 1) if s % f == 0 and s // f >= 2), None)


# ---------------------------------------------------------------- walking normal forms


def bound_indices(store: NFStore, exprs: list[int]) -> list[int]:
    out: set[int] = set()
    for f in _factors(store, exprs):
        k = store.fkey(f)
        if k[0] == "sum":
            out.update(i for i, _ in k[1])
    return sorted(out)


def atom_names(store: NFStore, exprs: list[int]) -> set[str]:
    return {store.fkey(f)[1] for f in _factors(store, exprs) if store.fkey(f)[0] == "in"}


def _factors(store: NFStore, exprs: list[int]) -> list[int]:
    seen: list[int] = []
    stack = [("e", e) for e in exprs]
    visited = set()
    while stack:
        kind, x = stack.pop()
        if (kind, x) in visited:
            continue
        visited.add((kind, x))
        monos = [m for m, _ in store.terms(x)] if kind == "e" else [x]
        for m in monos:
            for f, _ in store.mono_items(m):
                seen.append(f)
                k = store.fkey(f)
                if k[0] in ("fn", "inv"):
                    stack.append(("e", k[-1]))
                elif k[0] == "sum":
                    stack.append(("m", k[2]))
    return seen


def _inner(store: NFStore, f: int) -> int:
    """The body of sum factor ``f`` as an expr."""
    return store.expr({store.fkey(f)[2]: Fraction(1)})


def frontier(store: NFStore, exprs: list[int], r: int) -> list[int]:
    """The outermost sum factors that bind all of index ``r``, in a deterministic order."""
    out: list[int] = []

    def walk_mono(m):
        for f, _ in store.mono_items(m):
            k = store.fkey(f)
            if k[0] == "sum" and (r, ALL) in k[1]:
                if f not in out:
                    out.append(f)
            elif k[0] == "sum":
                walk_mono(k[2])
            elif k[0] in ("fn", "inv"):
                walk_expr(k[-1])

    def walk_expr(e):
        for m, _ in store.terms(e):
            walk_mono(m)

    for e in exprs:
        walk_expr(e)
    return out


# ---------------------------------------------------------------- patterns


def enumerate_patterns(program: KernelGraph, index: ProgramIndex, budget: SearchBudget) -> list[Pattern]:
    store = NFStore()
    env = program_exprs(program, index, store)
    targets = [env[o] for o in program.outputs]
    in_labels = {i for v in program.inputs for i in index.labels[v.name] if i >= 0}
    bound = [i for i in bound_indices(store, targets) if i in in_labels]
    out_sets = [set(index.labels[o]) - {-1} for o in program.outputs]
    first = index.labels[program.outputs[0]]
    common = sorted(set.intersection(*out_sets), key=lambda i: -first.index(i))
    # A block must see the whole of every sum it finishes, and outputs are loop-invariant: a single
    # kernel's grid never partitions a summed index and its loop never walks an output index.
    free_out = set().union(*out_sets)
    tileable = [i for i in common if i not in bound]
    pats = []
    for loop in [-1] + [i for i in bound if i not in free_out]:
        for n in range(0, min(budget.grid_dims, len(tileable)) + 1):
            for combo in combinations(tileable, n):
                pats.append(Pattern(combo, loop, -1))
    if budget.max_kernels >= 2:
        for r in bound:
            fr = frontier(store, targets, r)
            # the split kernel sees part of r: a frontier sum with a whole sum over r inside is out of reach
            if not fr or any(r in bound_indices(store, [_inner(store, f)]) for f in fr):
                continue
            free = sorted(set.intersection(*(set(store.free(f)) for f in fr)), reverse=True)
            for loop in [-1] + [i for i in bound if i == r or i not in free]:
                for n in range(0, min(budget.grid_dims - 1, len(free)) + 1):
                    for combo in combinations(free, n):
                        pats.append(Pattern(combo + (r,), loop, r))
    return [p for p in pats if representative(p, index.sizes) is not None]


# ---------------------------------------------------------------- one pattern


def _block(store, targets, sources, pattern, index, vocab, consts, budget, cap, stats, known=(), precision=None):
    rep = representative(pattern, index.sizes)
    exp_args = stats["exp_args"](store) if stats["exp_args"] is not None else None
    scales = tuple(v for v, _ in consts)
    if exp_args is not None:
        # two constants in a row scale an exp operand: (s·scale)/softcap inside Gemma-2's tanh; only
        # for these programs (a weaker oracle costs the others their pruning: QKNorm 3× the states)
        scales += tuple(a * b for a in scales for b in scales) + tuple(a / b for a in scales for b in scales if b)
    # an exp operand's own sub-values (RoPE'd q inside q·kᵀ) are sums the targets hold only inside
    # exp, which the normal form splits into a product of exps: the oracle takes the operands as
    # targets too, or it prunes them (``exp_arg`` keeps the exps themselves to these operands)
    pool = list(targets) + sorted(exp_args or ())
    oracle = SubexprOracle(store, pool, scales, known) if budget.abstract_pruning else None
    bs = BlockSearch(store, oracle, sources, pattern, rep[0], rep[1], vocab, consts, budget.max_block_ops, cap,
                     stats["deadline"], exp_args, precision=precision if budget.keep_precision else None)
    stats["bs"].append((bs, oracle))
    return bs


def run_pattern(program: KernelGraph, index: ProgramIndex, pattern: Pattern, budget: SearchBudget,
                cap: int, deadline: float = float("inf"), whole_exp: bool = False) -> tuple[list[tuple], dict]:
    """Search one pattern. Returns (designs, stats): each design is a tuple of kernel skeletons.

    ``whole_exp``: the program's softmax subtracts a max (``softmax.cancel_max``), so every exp of a
    design must take one of the program's exp operands whole, for the max to be put back."""
    vocab = vocabulary(program)

    def exp_args(store):  # the normal forms of the program's exp operands, in ``store``
        env = program_exprs(program, index, store)
        return frozenset(env[n.args[0]] for n in program.nodes if n.op == "exp")

    col: dict = {"bs": [], "deadline": deadline, "exp_args": exp_args if whole_exp else None}
    store = NFStore(nontrivial(pattern))
    env = program_exprs(program, index, store)
    targets = [env[o] for o in program.outputs]
    designs: list[tuple] = []
    if pattern.split < 0:
        goals = [Goal(t, index.labels[o], o, program.type_of(o).dtype) for t, o in zip(targets, program.outputs)]
        # The program's own values are always part of the computation: a mean subtraction's terms
        # merge only after its sum (Σ_i c = n·c), which the subexpression rules cannot foresee.
        bs = _block(store, targets, _program_sources(program, index, store, targets), pattern, index,
                    vocab, index.consts, budget, cap, col, known=tuple(env.values()),
                    precision=PrecisionFloor(program, env))
        found = bs.run(goals, guide=(program, env, index.labels))
        if found:
            designs.append((bs.skeleton(found, goals, -1),))
    else:
        fr = frontier(store, targets, pattern.split)
        goals = [Goal(store.expr({store.mono({f: 1}): Fraction(1)}), None, f"part{j}") for j, f in enumerate(fr)]
        bs = _block(store, [g.expr for g in goals], _program_sources(program, index, store, [g.expr for g in goals]),
                    pattern, index, vocab, index.consts, budget, cap, col, precision=PrecisionFloor(program, env))
        found = bs.run(goals, split=pattern.split, guide=(program, env, index.labels))
        if found:
            # a part that is a program output as it stands (split-K of a bare projection) is left in its
            # dtype: the codegen adds the parts in a float32 workspace and rounds the total once, and a
            # combine would only cast it
            k1, wide = widen_partials(bs.skeleton(found, goals, pattern.split),
                                      [bs.vals[found[g.name]].type.dtype for g in goals],
                                      [g.expr in targets for g in goals])
            parts = [Source(name, labels, TensorType(tuple(index.sizes[i] if i >= 0 else 1 for i in labels), dt))
                     for (_, _, _, name), labels, dt in zip(k1.outputs, k1.out_labels, wide)]
            for k2 in _combine_kernels(program, index, pattern.split, parts, vocab, budget, cap, col):
                designs.append((k1, k2))
    stats = _collect(col)
    return designs, stats


def _combine_kernels(program, index, split, parts, vocab, budget, cap, col) -> list:
    """The second kernel: the target with the split kernel's outputs as inputs. Searched once
    without a grid (it only combines finished sums), then retargeted to every grid over the
    output indices (``skeleton.retarget``)."""
    p0 = Pattern((), -1, -1)
    store = NFStore(nontrivial(p0))
    env = program_exprs(program, index, store)
    targets = [env[o] for o in program.outputs]
    table = {f: store.atom(s.name, s.labels) for f, s in zip(frontier(store, targets, split), parts)}
    t2 = [store.substitute(t, table) for t in targets]
    names = atom_names(store, t2)
    srcs = _program_sources(program, index, store, t2) + [s for s in parts if s.name in names]
    goals = [Goal(t, index.labels[o], o, program.type_of(o).dtype) for t, o in zip(t2, program.outputs)]
    # the parts arrive at the accumulation precision (``precision.widen_partials``): the combine may
    # compute on them wide and round its results to the program's output dtypes
    out_dtypes = {g.dtype for g in goals} - {s.type.dtype for s in parts}
    vocab = dict(vocab, cast=sorted(set(vocab["cast"]) | out_dtypes))
    bs = _block(store, t2, srcs, p0, index, vocab, index.consts, budget, cap, col)
    found = bs.run(goals)
    if not found:
        return []
    k2 = bs.skeleton(found, goals, -1)
    labels = {s.name: s.labels for s in srcs}
    common = sorted(set.intersection(*(set(index.labels[o]) - {-1} for o in program.outputs)),
                    key=lambda i: -index.labels[program.outputs[0]].index(i))
    out = []
    for n in range(min(budget.grid_dims, len(common)), -1, -1):
        for combo in combinations(common, n):
            p = Pattern(combo, -1, -1)
            if representative(p, index.sizes) is not None:
                out.append(retarget(k2, p, labels))
    return out


def _program_sources(program, index, store, exprs) -> list[Source]:
    names = atom_names(store, exprs)
    return [Source(v.name, index.labels[v.name], v.type) for v in program.inputs if v.name in names]


def _collect(col: dict) -> dict:
    st = {"states": 0, "values": 0, "pruned": {}, "oracle_queries": 0, "oracle_hits": 0,
          "oracle_seconds": 0.0, "cap_hit": 0}
    for bs, oracle in col["bs"]:
        st["states"] += bs.states
        st["values"] += len(bs.vals)
        st["cap_hit"] += int(bs.cap_hit)
        for k, v in bs.pruned.items():
            st["pruned"][k] = st["pruned"].get(k, 0) + v
        if oracle is not None:
            st["oracle_queries"] += oracle.queries
            st["oracle_hits"] += oracle.hits
            st["oracle_seconds"] += oracle.seconds
    return st
