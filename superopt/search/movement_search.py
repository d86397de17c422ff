"""Search a program with data movement: lower it (``search.movement``), search the core, raise
every result back onto the program's own inputs and outputs, verify the winner against the program.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..ir import KernelGraph, Node, TensorType, Value, check, make_attrs
from ..ir.movement import view_shape
from .cost import graph_cost
from .driver import SearchResult  # the driver imports this module only inside superoptimize
from .movement import Lowered, lower


def raise_graph(low: Lowered, g: KernelGraph, arch: str = "sm_90", pre: tuple = ()) -> KernelGraph:
    """``g`` (a μGraph of ``low.core``) as a μGraph of ``low.program``: the pre programs' μGraphs
    (``pre``, one per ``low.pre``) first, then prefix ops, views of external tensors folded into the
    block inputs that read them, output views last."""
    if len(pre) != len(low.pre):
        raise ValueError(f"raise_graph: {len(low.pre)} pre program(s), {len(pre)} μGraph(s) given")
    nodes: list[Node] = [n for pg in pre for n in pg.nodes] + list(low.prefix)
    made: set[str] = set()
    types = {v.name: v.type for v in low.program.inputs}
    types.update((n.out.name, n.out.type) for n in low.prefix)
    for n in g.nodes:
        if n.op == "customized":
            nodes.append(_raise_kernel(low, n))
            continue
        for a in n.args:  # a library op of the unfused core reads the view itself
            if a in low.views and a not in made:
                nodes += _materialise(a, *low.views[a], types)
                made.add(a)
        nodes.append(n)
    wanted = set(low.program.outputs) | {a for n in low.suffix for a in n.args}
    for a in sorted(wanted & set(low.views) - made):  # an output that is a view of an input
        nodes += _materialise(a, *low.views[a], types)
    nodes += low.suffix
    name = g.name.replace(low.core.name, low.program.name, 1)
    return check(KernelGraph(low.program.inputs, tuple(nodes), low.program.outputs, name), arch)


def _raise_kernel(low: Lowered, n: Node) -> Node:
    where = [low.views.get(a, (a, ())) for a in n.args]
    sources = list(dict.fromkeys(src for src, _ in where))
    inputs = tuple(replace(i, source=sources.index(where[i.source][0]), view=where[i.source][1] + i.view)
                   for i in n.block.inputs)
    return replace(n, args=tuple(sources), block=replace(n.block, inputs=inputs))


def _materialise(name: str, src: str, steps: tuple, types: dict) -> list[Node]:
    out, cur = [], src
    for k, step in enumerate(steps):
        t = types[cur]
        shape = view_shape(t.shape, (step,))
        dst = name if k == len(steps) - 1 else f"{name}_v{k}"
        attrs = make_attrs(dim=step[1], start=step[2], stop=step[3]) if step[0] == "slice" else \
            make_attrs(dim=step[1], times=step[2])
        out.append(Node(step[0], (cur,), (Value(dst, TensorType(shape, t.dtype)),), attrs))
        types[dst] = out[-1].out.type
        cur = dst
    return out


def superoptimize_lowered(program: KernelGraph, budget, arch: str, seed: int, checkpoint, search):
    """``search`` (``superoptimize``) on ``program``'s core; None when lowering changes nothing."""
    t0 = time.perf_counter()
    try:
        low = lower(program)
    except (ValueError, KeyError):  # a form the lowering does not know: the plain search's fallback
        return None
    if not low.changed or low.core is program:
        return None
    t_lower = time.perf_counter() - t0
    pre = [search(p, budget, arch, seed, checkpoint) for p in low.pre]  # each alone, its own verdict
    inner = search(low.core, budget, arch, seed, checkpoint)
    return _raised_result(low, inner, t_lower, arch, seed, budget, pre)


def _raised_result(low: Lowered, inner, t_lower: float, arch: str, seed: int, budget, pre=()):
    from ..verify import check_equivalent
    stats = inner.stats
    pre_graphs = tuple(r.best for r in pre)
    for p, r in zip(low.pre, pre):
        stats.verify_notes.append(f"pre program {p.name}: {r.best.num_kernels} kernel(s)"
                                  f"{' (its unfused fallback)' if r.best is p else ''}")
    entries = []
    for i, (g, _) in enumerate(inner.ranked):
        design = inner.designs[i] if i < len(inner.designs) else (None, None)
        if design[0] is None:
            continue  # the core's fallback: the program itself stands for it below
        try:
            r = raise_graph(low, g, arch, pre_graphs)
            alts = [raise_graph(low, a, arch, pre_graphs) for a in (inner.alternatives[i] if i < len(inner.alternatives) else [])]
        except (ValueError, KeyError) as e:
            stats.verify_notes.append(f"raise failed: {type(e).__name__}: {e}")
            continue
        entries.append((r, graph_cost(r, arch), design, alts))
    entries.append((low.program, graph_cost(low.program, arch), (None, None), []))
    entries.sort(key=lambda e: e[1])
    t0 = time.perf_counter()
    if entries[0][2][0] is not None:
        n = sum(v.type.numel for v in low.program.inputs)
        if n <= budget.full_verify_elements:
            v = check_equivalent(low.program, entries[0][0], trials=2, seed=seed, float_check=False)
            stats.verify_notes.append(f"raised winner vs the program with data movement: {v}")
            if not v.equivalent:
                stats.rejected += 1
                entries.pop(0)
        else:
            stats.verify_notes.append(f"raised winner not re-verified ({n} input elements)")
    stats.seconds["lower"] = t_lower
    stats.seconds["raise_verify"] = time.perf_counter() - t0
    stats.verify_notes.append(f"data movement lowered: {len(low.views)} input view(s), {len(low.prefix)} "
                              f"prefix op(s), {len(low.suffix)} output view(s)")
    return LoweredResult(low.program, budget, arch, seed, [(g, c) for g, c, _, _ in entries], stats,
                         [d for _, _, d, _ in entries], [a for _, _, _, a in entries], low, inner, tuple(pre))


@dataclass
class LoweredResult(SearchResult):
    """A search result over a program with data movement; ``inner`` is the core's own result."""

    lowered: object = None
    inner: object = None
    pre: tuple = ()      # the pre programs' own results (``movement.Lowered.pre``)

    def reinstantiate(self, program: KernelGraph) -> "LoweredResult":
        t0 = time.perf_counter()
        low = lower(program)
        inner = self.inner.reinstantiate(low.core)
        pre = tuple(r.reinstantiate(p) for r, p in zip(self.pre, low.pre))
        return _raised_result(low, inner, time.perf_counter() - t0, self.arch, self.seed, self.budget, pre)
