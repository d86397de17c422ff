"""Data movement around the search: slices, chunks and head repeats become block-input views,
output slices become free views, gathers and cache writes run before the fused kernels.

The abstract domain the block search prunes with knows no offsets, so a program with a slice
(Phi-3's ``qkv_proj`` + split, its ``gate_up_proj`` + chunk) is first *lowered* to a core program
without them, searched, and each verified μGraph *raised* back (DESIGN.md "Search"):

1. **Output views.** An output that is a chain of slices / reshapes of a computed value (q, k, v
   split from the fused projection) is taken as that view of the value: the core program outputs
   the value, the raised graph ends with the views (no launch, ``ir.graph.VIEW_OPS``).
2. **Slices pushed to the inputs.** A slice of a matmul or a transpose whose every user is a
   slice, or of a cast or an elementwise result (recomputed on the slice where it is also read
   whole), is moved onto the operands that carry the sliced dim
   (``slice(x @ W.T, cols) = x @ slice(W, rows).T``), until slices and head repeats sit on
   external tensors; HF's ``repeat_kv`` (unsqueeze → expand → reshape) is one head repeat.
3. **Views become inputs.** A slice or repeat chain of an external tensor is a fresh core input;
   the raised kernel's block input reads the external tensor through the chain (``BlockInput.view``,
   an offset or an index division in the imap): ``chunk`` costs no kernel and no copy.
4. **Prefix ops.** A gather or a scatter whose operands are all external (cos / sin at the
   position, the KV-cache write) runs as a library op before the fused kernels; its result is a
   core input. The updated cache stays an output. A reshape of an external tensor (q viewed as
   heads) is a prefix view: no launch, and the core reads it as an input of the new shape.
5. **Pre programs.** A cache write whose new row is computed (the step's key after k-norm and
   RoPE) cannot be a prefix op as it stands: the row's cone (everything it depends on) becomes a
   program of its own, searched by itself and launched first; its result is then external and
   the write a prefix op. The cone's nodes stay in the core too when something else reads them
   (recomputed there, never read back), so the core's search is unchanged.

The core program is searched by ``superoptimize``; every raised graph is checked
(``ir.check``) and the best one verified against the original program by the finite-field test,
so a lowering mistake cannot pass silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import BINARY_OPS, UNARY_OPS, KernelGraph, Node, TensorType, Value, check, make_attrs

PUSH_THROUGH = UNARY_OPS | BINARY_OPS | {"matmul", "transpose", "cast"}  # slicing commutes with them
OUTPUT_VIEWS = frozenset({"slice", "reshape"})
PREFIX_OPS = frozenset({"gather", "scatter"})
# what sends a program through ``lower`` first; a reshape only at the program's edges (an input
# viewed as heads, the output viewed back: the grouped decode attention) — elsewhere it stays and
# the lowering changes nothing
LOWERED_OPS = frozenset({"slice", "repeat", "gather", "scatter", "reshape"})


@dataclass(frozen=True)
class Lowered:
    program: KernelGraph                       # the original program
    core: KernelGraph                          # what the search sees
    views: dict = field(default_factory=dict)  # core input -> (external tensor, view steps)
    prefix: tuple = ()                         # library nodes before the core (gather, scatter)
    pre: tuple = ()                            # programs searched alone, run before the prefix
    suffix: tuple = ()                         # view nodes after the core (output slices)

    @property
    def changed(self) -> bool:
        return bool(self.views or self.prefix or self.suffix or self.pre)


class _Builder:
    def __init__(self, program: KernelGraph):
        self.nodes: list[Node] = list(program.nodes)
        self.inputs = {v.name: v for v in program.inputs}
        self.names = {v.name for v in program.inputs} | {v.name for n in program.nodes for v in n.outs}
        self.counter = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.counter += 1
            name = f"{hint}_m{self.counter}"
            if name not in self.names:
                self.names.add(name)
                return name

    def producer(self) -> dict[str, Node]:
        return {v.name: n for n in self.nodes for v in n.outs}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for a in n.args:
                out.setdefault(a, []).append(n)
        return out


def _slice(name: str, t: TensorType, dim: int, start: int, stop: int, out: str) -> Node:
    shape = list(t.shape)
    shape[dim] = stop - start
    return Node("slice", (name,), (Value(out, TensorType(tuple(shape), t.dtype)),),
                make_attrs(dim=dim, start=start, stop=stop))


def lower(program: KernelGraph) -> Lowered:
    b = _Builder(program)
    outputs = list(program.outputs)
    suffix = _peel_outputs(b, outputs)
    pre = _pre_programs(b, program)
    _merge_repeat_kv(b)
    while _push_slices(b):
        b.nodes = _live(b.nodes, outputs)  # the pushed slice's old operand, if nothing else reads it
    views, prefix = _externalise(b, program)
    prefix_names = {n.out.name for n in prefix}
    core_outputs = [o for o in dict.fromkeys(outputs)
                    if o not in prefix_names and o not in b.inputs and o not in views]
    nodes = _live(b.nodes, core_outputs)
    used = {a for n in nodes for a in n.args} | set(core_outputs)
    inputs = [v for v in program.inputs if v.name in used]
    inputs += [Value(o, p.output_types[0]) for p in pre for o in p.outputs if o in used]
    inputs += [Value(n.out.name, n.out.type) for n in prefix if n.out.name in used]
    inputs += [Value(k, t) for k, (t, _, _) in views.items() if k in used]
    if not core_outputs:
        core = program
    else:
        core = check(KernelGraph(tuple(inputs), tuple(nodes), tuple(core_outputs), f"{program.name}_core"))
    wanted = used | set(program.outputs) | {a for n in suffix for a in n.args}
    vmap = {k: (src, steps) for k, (_, src, steps) in views.items() if k in wanted}
    return Lowered(program, core, vmap, tuple(prefix), pre=tuple(pre), suffix=tuple(suffix))


def _pre_programs(b: _Builder, program: KernelGraph) -> list[KernelGraph]:
    """Each computed row a scatter writes (cache and index external) as a program of its own
    (step 5 of the module docstring); the row becomes an external value of the builder."""
    prod = b.producer()
    pre = []
    for n in list(b.nodes):
        if n.op != "scatter" or not all(a in b.inputs for a in n.args[:2]) or n.args[2] in b.inputs:
            continue
        cone, stack = {}, [n.args[2]]
        while stack:
            x = stack.pop()
            if x in cone or x in b.inputs:
                continue
            cone[x] = prod[x]
            stack.extend(prod[x].args)
        if any(m.op == "scatter" for m in cone.values()):
            continue
        nodes = [m for m in b.nodes if m.out.name in cone]
        used = {a for m in nodes for a in m.args}
        ins = tuple(v for v in program.inputs if v.name in used)
        src = n.args[2]
        pre.append(check(KernelGraph(ins, tuple(nodes), (src,), f"{program.name}_{src}_pre")))
        b.inputs[src] = Value(src, prod[src].out.type)
    return pre


def _peel_outputs(b: _Builder, outputs: list[str]) -> list[Node]:
    """View nodes (slice, reshape) whose every reader is another such node, and that lead only to
    outputs: they run after the core as views. ``outputs`` becomes the core's: the bases."""
    users = b.users()
    outs = set(outputs)
    peel: set[int] = set()
    for n in reversed(b.nodes):
        readers = users.get(n.out.name, [])
        if n.op in OUTPUT_VIEWS and n.args[0] not in b.inputs and (readers or n.out.name in outs) \
                and all(id(r) in peel for r in readers):
            peel.add(id(n))
    suffix = [n for n in b.nodes if id(n) in peel]
    by_out = {n.out.name: n for n in suffix}
    for i, o in enumerate(outputs):
        while o in by_out:
            o = by_out[o].args[0]
        outputs[i] = o
    outputs += [n.args[0] for n in suffix if n.args[0] not in by_out and n.args[0] not in outputs]
    b.nodes = [n for n in b.nodes if id(n) not in peel]
    return suffix


def _merge_repeat_kv(b: _Builder) -> None:
    """reshape(repeat(reshape(x, unsqueeze d+1), d+1, n), merge d and d+1) → repeat(x, d, n)."""
    prod, users = b.producer(), b.users()
    out = []
    for n in b.nodes:
        r = prod.get(n.args[0]) if n.op == "reshape" else None
        u = prod.get(r.args[0]) if r is not None and r.op == "repeat" else None
        if u is not None and u.op == "reshape" and len(users.get(r.out.name, [])) == 1:
            x_shape = _type(b, u.args[0]).shape
            d = r.attr("dim") - 1
            times = r.attr("times")
            want_u = x_shape[:d + 1] + (1,) + x_shape[d + 1:]
            want_n = x_shape[:d] + (x_shape[d] * times,) + x_shape[d + 1:]
            if d >= 0 and u.out.type.shape == want_u and n.out.type.shape == want_n:
                out.append(Node("repeat", (u.args[0],), n.outs, make_attrs(dim=d, times=times)))
                continue
        out.append(n)
    b.nodes = out


def _type(b: _Builder, name: str) -> TensorType:
    if name in b.inputs:
        return b.inputs[name].type
    return b.producer()[name].out.type


def _push_slices(b: _Builder) -> bool:
    """Move one slice below the op that produced its operand; True if something moved."""
    prod, users = b.producer(), b.users()
    for n in b.nodes:
        if n.op != "slice" or n.args[0] not in prod:
            continue
        src = prod[n.args[0]]
        # an elementwise result read whole too (Qwen3's normed q: RoPE reads it and its halves)
        # is recomputed on the halves, cheap in a kernel; a matmul or transpose only when every
        # reader slices it
        elementwise = src.op in UNARY_OPS | BINARY_OPS | {"cast"}
        if src.op not in PUSH_THROUGH or not elementwise and any(u.op != "slice" for u in users[n.args[0]]):
            continue
        new = _pushed(b, n, src)
        if new is None:
            continue
        pos = b.nodes.index(n)
        b.nodes[pos:pos + 1] = new
        return True
    return False


def _pushed(b: _Builder, s: Node, src: Node) -> list[Node] | None:
    """Nodes computing slice ``s`` of ``src``'s result from slices of ``src``'s operands."""
    dim, start, stop = s.attr("dim"), s.attr("start"), s.attr("stop")
    out_t = src.out.type
    rank = len(out_t.shape)
    new: list[Node] = []
    args = []
    for pos, a in enumerate(src.args):
        at = _type(b, a)
        d = _operand_dim(src.op, at, rank, dim, pos)
        if d is None:
            if src.op == "matmul" and dim < rank - 2:
                return None  # a batch dim of a matmul: left where it is
            args.append(a)  # the operand does not carry the sliced dim: read whole
            continue
        name = b.fresh(a)
        new.append(_slice(a, at, d, start, stop, name))
        args.append(name)
    new.append(Node(src.op, tuple(args), s.outs, src.attrs))
    return new


def _operand_dim(op: str, at: TensorType, rank: int, dim: int, pos: int) -> int | None:
    """The dim of operand ``pos`` that carries result dim ``dim`` (None: it does not, e.g. a
    broadcast operand, or the other side of a matmul)."""
    if op == "transpose":
        return {rank - 1: rank - 2, rank - 2: rank - 1}.get(dim, dim)
    if op == "matmul":
        if dim == rank - 1:
            return at.rank - 1 if pos == 1 else None   # columns: the rhs's
        if dim == rank - 2:
            return at.rank - 2 if pos == 0 else None   # rows: the lhs's
        return None  # a batch dim: not pushed
    off = rank - at.rank
    d = dim - off
    if d < 0 or at.shape[d] == 1:
        return None
    return d


def _externalise(b: _Builder, program: KernelGraph):
    """Slice / repeat chains of external tensors → core inputs with views; gathers / scatters of
    external tensors → prefix nodes. Returns (views, prefix)."""
    views: dict[str, tuple] = {}   # name -> (type, external tensor, steps)
    prefix: list[Node] = []
    external = set(b.inputs)
    changed = True
    while changed:
        changed = False
        kept = []
        for n in b.nodes:
            if n.op in ("slice", "repeat") and (n.args[0] in external or n.args[0] in views):
                base, steps = (views[n.args[0]][1:] if n.args[0] in views else (n.args[0], ()))
                d = n.attr("dim")
                step = (("slice", d, n.attr("start"), n.attr("stop")) if n.op == "slice"
                        else ("repeat", d, n.attr("times")))
                views[n.out.name] = (n.out.type, base, steps + (step,))
                changed = True
            elif (n.op in PREFIX_OPS or n.op == "reshape") and all(a in external for a in n.args):
                prefix.append(n)
                external.add(n.out.name)
                changed = True
            else:
                kept.append(n)
        b.nodes = kept
    return views, prefix


def _live(nodes: list[Node], outputs: list[str]) -> list[Node]:
    need = set(outputs)
    out = []
    for n in reversed(nodes):
        if any(v.name in need for v in n.outs):
            out.append(n)
            need.update(n.args)
    return list(reversed(out))


__all__ = ["LOWERED_OPS", "Lowered", "lower"]
