"""Online softmax in the search: search the max-cancelled program, then keep the max in every design.

A max-subtracted softmax, ``exp(x − max(x)) / Σ exp(x − max(x))`` (Hugging Face's eager attention,
``torch.softmax``), equals ``exp(x) / Σ exp(x)``: the max only keeps the exponentials in range. The
search therefore runs on the program with the max cancelled (``cancel_max``), where the abstract
domain's normal forms already decide every reordering (flash attention: both sums accumulated over
the KV loop, the division after it; flash-decoding: KV split across blocks, a combine kernel).

A design found there is unsafe in bf16 / fp16: its exponentials overflow. ``stabilize`` turns every
built candidate back into one that keeps the max, by rules that follow from each ``exp`` node's
consumers, not from a template of attention:

* ``exp(a)`` whose result is summed over tile dims D: ``exp(a − m)`` with ``m = max_D(a)`` (keepdim);
* inside the for-loop: ``m = accum_max(max_D(a))``, the running max, and every ``accum_sum`` that
  reads the exponential becomes ``accum_sum_rescaled(·, m)`` (acc·exp(m_prev − m) + x);
* a split kernel's cross-block sum of a value scaled by exp(−m_j) is not a plain sum: each block
  writes its partial and its m_j (the split becomes a dim of a view), and the combine kernel
  reads them as ``Σ_j exp(m_j − M)·part_j`` with ``M = max_j m_j`` before its own (searched) body.

Every rewritten candidate is verified against the *original* program (the verifier treats max as
a symmetric opaque function, so a missing rescale is caught), so the cancellation is only a
search device: a program whose max does not cancel finds no verified design and falls back.
See docs/architecture.md (Search, online softmax).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import (BlockGraph, BlockInput, BlockOutput, KernelGraph, Node, TensorType, Value, block_variance,
                  infer_type, make_attrs, output_shape)
from ..ir.check import Variance
from .instantiate import _thread_groups


class Unstabilizable(ValueError):
    """A candidate whose exponentials cannot all be max-subtracted by the rules above."""


# ---------------------------------------------------------------- the program


def cancel_max(program: KernelGraph) -> tuple[KernelGraph, int]:
    """``program`` with each ``exp(x − max(x, d, keepdim))`` written ``exp(x)``, and how many were.

    Only the exp's operand changes; a max or a subtraction left without a consumer is dropped."""
    by_out = {n.out.name: n for n in program.nodes if len(n.outs) == 1}
    nodes, done = list(program.nodes), 0
    for i, n in enumerate(nodes):
        if n.op != "exp":
            continue
        sub = by_out.get(n.args[0])
        if sub is None or sub.op != "sub":
            continue
        mx = by_out.get(sub.args[1])
        if mx is None or mx.op != "reduce_max" or mx.args[0] != sub.args[0] or not mx.attr("keepdim"):
            continue
        nodes[i] = replace(n, args=(sub.args[0],))
        done += 1
    if not done:
        return program, 0
    while True:  # drop what no longer feeds anything
        used = set(program.outputs) | {a for n in nodes for a in n.args}
        kept = [n for n in nodes if n.op == "const" or any(v.name in used for v in n.outs)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    return KernelGraph(program.inputs, tuple(nodes), program.outputs, program.name), done


def prepare(program: KernelGraph):
    """(the program to search, the pass every built candidate goes through or None)."""
    search_program, cancelled = cancel_max(program)
    if not cancelled:
        return search_program, None
    dtypes = dict(zip(program.outputs, (t.dtype for t in program.output_types)))
    return search_program, lambda g: stabilize(g, dtypes)


# ---------------------------------------------------------------- one block graph


class _Block:
    """A block graph being rewritten: its nodes in order, the type of each value, fresh names."""

    def __init__(self, b: BlockGraph):
        self.b = b
        self.types = {i.value.name: i.value.type for i in b.inputs}
        self.types.update((n.out.name, n.out.type) for n in b.nodes)
        self.n = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.n += 1
            name = f"{hint}{self.n}"
            if name not in self.types:
                return name

    def node(self, op: str, args: tuple[str, ...], name: str | None = None, **attrs) -> Node:
        at = make_attrs(**attrs)
        t = infer_type(op, [self.types[a] for a in args], at)
        name = name or self.fresh("sm")
        self.types[name] = t
        return Node(op, args, (Value(name, t),), at)


def _consumers(nodes) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for n in nodes:
        for a in n.args:
            out.setdefault(a, []).append(n)
    return out


def _summed_dims(name: str, rank: int, consumers: dict) -> set[int]:
    """Dims of value ``name`` that its consumers sum over in the tile (through elementwise chains)."""
    dims: set[int] = set()
    stack, seen = [name], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        for c in consumers.get(x, []):
            if c.op == "reduce_sum":
                d = c.attr("dim")
                dims.add(d % rank)
            elif c.op == "matmul":
                dims.add(rank - 1 if c.args[0] == x else rank - 2)
            elif c.op in ("mul", "div", "add", "sub", "cast", "neg") and c.out.type.rank == rank:
                stack.append(c.out.name)
    return dims


def _uncast(a: str, by_out: dict) -> str:
    while a in by_out and by_out[a].op == "cast":
        a = by_out[a].args[0]
    return a


def _max_subtracted(a: str, by_out: dict) -> bool:
    """``a`` is x − m with m a max (already safe: the combine's exp(m_j − M))."""
    n = by_out.get(a)
    return n is not None and n.op == "sub" and n.args[1] in by_out and \
        by_out[n.args[1]].op in ("reduce_max", "accum_max")


def stabilize_block(b: BlockGraph, outputs_summed: bool) -> tuple[BlockGraph, dict[str, str]]:
    """Max-subtract every exp of ``b``; return the block and, for each output whose value is scaled
    by exp(−m) of a per-block max m, the name of m (only where ``outputs_summed``: the output is
    summed across blocks). Raises ``Unstabilizable``."""
    if not any(n.op == "exp" for n in b.nodes):
        return b, {}
    w = _Block(b)
    var = block_variance(b)
    cons = _consumers(b.nodes)
    nodes: list[Node] = []
    scale_of: dict[str, str] = {}   # value -> the max m it is scaled by exp(−m) of
    by_out = {n.out.name: n for n in b.nodes}
    max_of: dict[str, str] = {}     # value the exps' operands are casts of -> its max
    for n in b.nodes:
        if n.op == "exp" and not _max_subtracted(n.args[0], by_out):
            a = n.args[0]
            t = w.types[a]
            root = _uncast(a, by_out)
            m = max_of.get(root)
            if m is None:  # the first exp of this operand: its max (the same exp in another dtype reuses it)
                m = a
                dims = sorted(_summed_dims(n.out.name, t.rank, cons))
                for d in dims:
                    nd = w.node("reduce_max", (m,), dim=d, keepdim=1)
                    nodes.append(nd)
                    m = nd.out.name
                if var[a] == Variance.LOOP:
                    nd = w.node("accum_max", (m,))
                    nodes.append(nd)
                    m = nd.out.name
                elif not dims:
                    raise Unstabilizable(f"exp -> %{n.out.name} is neither summed in the tile nor in the loop")
                max_of[root] = m
            if w.types[m].dtype == t.dtype:
                sh = w.node("sub", (a, m))
                nodes += [sh, w.node("exp", (sh.out.name,), name=n.out.name)]
            else:  # in the max's dtype, then back (a running max cast would be read after the loop)
                ca = w.node("cast", (a,), dtype=w.types[m].dtype)
                sh = w.node("sub", (ca.out.name, m))
                ex = w.node("exp", (sh.out.name,))
                nodes += [ca, sh, ex, w.node("cast", (ex.out.name,), name=n.out.name, dtype=t.dtype)]
            scale_of[n.out.name] = m
            continue
        scales = {scale_of[a] for a in n.args if a in scale_of}
        if n.op == "accum_sum" and scales:
            if len(scales) > 1:
                raise Unstabilizable(f"accum_sum -> %{n.out.name} mixes exponentials of two maxes")
            n = w.node("accum_sum_rescaled", (n.args[0], scales.pop()), name=n.out.name)
            scales = {scale_of[n.args[0]]}
        elif n.op in ("div",) and len(n.args) == 2 and n.args[0] in scale_of and n.args[1] in scale_of \
                and scale_of[n.args[0]] == scale_of[n.args[1]]:
            scales = set()  # exp(−m)·x / exp(−m)·y: the scale cancels
        if len(scales) > 1:
            raise Unstabilizable(f"{n.op} -> %{n.out.name} mixes exponentials of two maxes")
        if scales:
            scale_of[n.out.name] = scales.pop()
        nodes.append(n)
    out_scale = {}
    for o in b.outputs:
        if o.value in scale_of:
            if not outputs_summed or o.reduce != "sum":
                raise Unstabilizable(f"output %{o.value} keeps a per-block exp(−max) scale")
            out_scale[o.value] = scale_of[o.value]
    outs = {o.value for o in b.outputs}
    return replace(b, nodes=tuple(nodes), thread_groups=_thread_groups(nodes, outs)), out_scale


# ---------------------------------------------------------------- the kernel graph


def stabilize(g: KernelGraph, out_dtypes: dict[str, str] | None = None) -> KernelGraph:
    """``g`` (a candidate of the max-cancelled program) with every exp max-subtracted; split
    kernels' rescaled partials written per split and combined with their maxes by the consumer
    kernel; graph outputs cast to ``out_dtypes`` (the program's) where the combine computed in
    float32. Raises ``Unstabilizable``."""
    nodes: list[Node] = []
    redirect: dict[str, tuple[Value, Value, TensorType]] = {}  # partial -> (its view, its max's view, its type)
    for n in g.nodes:
        if n.op != "customized":
            if any(a in redirect for a in n.args):
                raise Unstabilizable(f"{n.op} -> %{n.out.name} reads a split partial outside a kernel")
            nodes.append(n)
            continue
        n = _combine_reads(n, redirect) if any(a in redirect for a in n.args) else n
        b, out_scale = stabilize_block(n.block, outputs_summed=True)
        if not out_scale:
            nodes.append(replace(n, block=b))
            continue
        nodes += _per_split(n, b, out_scale, redirect)
    if any(o in redirect for o in g.outputs):
        raise Unstabilizable("a program output is a split partial")
    nodes = [_cast_outputs(n, out_dtypes) if n.op == "customized" and out_dtypes else n for n in nodes]
    return replace(g, nodes=tuple(nodes), _types=None)


def _cast_outputs(n: Node, out_dtypes: dict[str, str]) -> Node:
    """Block outputs that are program outputs stored in the program's dtype."""
    want = {i: out_dtypes[v.name] for i, v in enumerate(n.outs)
            if v.name in out_dtypes and v.type.dtype != out_dtypes[v.name]}
    if not want:
        return n
    w = _Block(n.block)
    nodes, outputs, outs = list(n.block.nodes), list(n.block.outputs), list(n.outs)
    for i, dt in want.items():
        c = w.node("cast", (outputs[i].value,), dtype=dt)
        nodes.append(c)
        outputs[i] = replace(outputs[i], value=c.out.name)
        outs[i] = Value(outs[i].name, TensorType(outs[i].type.shape, dt))
    keep = {o.value for o in outputs}
    block = replace(n.block, nodes=tuple(nodes), outputs=tuple(outputs), thread_groups=_thread_groups(nodes, keep))
    return replace(n, outs=tuple(outs), block=block)


def _per_split(n: Node, b: BlockGraph, out_scale: dict[str, str], redirect: dict) -> list[Node]:
    """The split kernel writes each rescaled partial and its max per split: the split grid axis maps
    onto the partial's last dim (blocks side by side), and a view splits that dim into
    (split, last). Returns the kernel node and the views; records them in ``redirect``."""
    w = _Block(b)
    types = w.types
    nodes = list(b.nodes)
    outputs, outs, views = [], [], []
    max_view: dict[str, Node] = {}   # max value -> the view of its per-split tensor

    def f32(x: str) -> str:
        # partials and maxes leave the block in float32: a max rounded to bf16 would no longer be
        # the one its partial was scaled by (exp(0.25) off at m ≈ 50)
        if types[x].dtype == "float32":
            return x
        c = w.node("cast", (x,), dtype="float32")
        nodes.append(c)
        return c.out.name

    for o, v in zip(b.outputs, n.outs):
        if o.value not in out_scale:
            outputs.append(o)
            outs.append(v)
            continue
        m, axis = out_scale[o.value], _split_axis(b, o)
        val = f32(o.value)
        omap = _split_omap(o, types[val], axis)
        raw = Value(f"{v.name}_split", TensorType(output_shape(types[val].shape, b.grid, omap), "float32"))
        outputs.append(BlockOutput(val, omap, "none"))
        outs.append(raw)
        pview = _view(raw, f"{v.name}_view", b.grid[axis])
        views.append(pview)
        if m not in max_view:
            mval = f32(m)
            mo = BlockOutput(mval, _split_omap(o, types[mval], axis), "none")
            mraw = Value(f"{v.name}_max_split", TensorType(output_shape(types[mval].shape, b.grid, mo.omap),
                                                             "float32"))
            outputs.append(mo)
            outs.append(mraw)
            max_view[m] = _view(mraw, f"{v.name}_max", b.grid[axis])
            views.append(max_view[m])
        redirect[v.name] = (pview.out, max_view[m].out, v.type)
    keep = {o.value for o in outputs}
    block = replace(b, nodes=tuple(nodes), outputs=tuple(outputs), thread_groups=_thread_groups(nodes, keep))
    return [Node("customized", n.args, tuple(outs), n.attrs, block)] + views


def _split_axis(b: BlockGraph, o: BlockOutput) -> int:
    axes = [a for a in range(3) if o.omap[a] == -1 and b.grid[a] > 1]
    if len(axes) != 1:
        raise Unstabilizable(f"output %{o.value} is summed over {len(axes)} grid axes; one split is supported")
    return axes[0]


def _split_omap(o: BlockOutput, tile: TensorType, axis: int) -> tuple[int, int, int]:
    last = tile.rank - 1
    if last < 0 or last in o.omap:
        raise Unstabilizable(f"output %{o.value}: its last dim is already tiled by the grid")
    omap = list(o.omap)
    omap[axis] = last
    return (omap[0], omap[1], omap[2])


def _view(raw: Value, name: str, splits: int) -> Node:
    """[..., splits·t] -> [..., splits, t]: block j's tile is columns [j·t, (j+1)·t)."""
    *lead, last = raw.type.shape
    shape = tuple(lead) + (splits, last // splits)
    return Node("reshape", (raw.name,), (Value(name, TensorType(shape, raw.type.dtype)),),
                make_attrs(shape=shape))


def _combine_reads(n: Node, redirect: dict) -> Node:
    """The consumer kernel reads each split partial through its view and sums the splits weighted by
    exp(m_j − max_j m_j) first; its own block graph then runs unchanged on those sums."""
    b = n.block
    w = _Block(b)
    args = list(n.args)

    def arg_of(name: str) -> int:
        if name not in args:
            args.append(name)
        return args.index(name)

    inputs, pre = [], []
    weights: dict[tuple, str] = {}
    for inp in b.inputs:
        src = n.args[inp.source]
        if src not in redirect:
            inputs.append(inp)
            continue
        view, mview, part_t = redirect[src]
        r = part_t.rank
        imap = tuple(d + 1 if d == r - 1 else d for d in inp.imap)   # the split dim sits before the last
        if inp.fmap != -1:
            raise Unstabilizable(f"the combine kernel loops over split partial %{src}")
        tile = inp.value.type.shape
        pv = w.fresh("pj")
        splits = view.type.shape[-2]
        pt = TensorType(tile[:-1] + (splits,) + tile[-1:], view.type.dtype)
        w.types[pv] = pt
        inputs.append(BlockInput(Value(pv, pt), arg_of(view.name), imap, -1))
        mimap = tuple(-1 if d == r else d for d in imap)               # the max's last dim is 1
        if mview.type.rank != view.type.rank:
            raise Unstabilizable(f"split partial %{src} and its max have different ranks")
        key = (mview.name, mimap)
        if key not in weights:
            mv = w.fresh("mj")
            mt = TensorType(tile[:-1] + (splits, 1), mview.type.dtype)
            w.types[mv] = mt
            inputs.append(BlockInput(Value(mv, mt), arg_of(mview.name), mimap, -1))
            big = w.node("reduce_max", (mv,), dim=r - 1, keepdim=1)            # M = max_j m_j
            dm = w.node("sub", (mv, big.out.name))
            wt = w.node("exp", (dm.out.name,))                                 # exp(m_j − M) ≤ 1
            pre += [big, dm, wt]
            weights[key] = wt.out.name
        pw = w.node("mul", (pv, weights[key]))
        pre.append(pw)
        if pt.dtype == inp.value.type.dtype:
            pre.append(w.node("reduce_sum", (pw.out.name,), name=inp.value.name, dim=r - 1, keepdim=0))
        else:  # the searched body reads the partial in its own dtype
            rs = w.node("reduce_sum", (pw.out.name,), dim=r - 1, keepdim=0)
            pre += [rs, w.node("cast", (rs.out.name,), name=inp.value.name, dtype=inp.value.type.dtype)]
    used = sorted({i.source for i in inputs})       # the partials themselves are no longer read
    inputs = [replace(i, source=used.index(i.source)) for i in inputs]
    nodes = pre + list(b.nodes)
    outs = {o.value for o in b.outputs}
    block = replace(b, inputs=tuple(inputs), nodes=tuple(nodes), thread_groups=_thread_groups(nodes, outs))
    return Node("customized", tuple(args[i] for i in used), n.outs, n.attrs, block)


