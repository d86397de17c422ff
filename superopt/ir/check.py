"""The checker: rejects invalid μGraphs with messages that say what is wrong and where."""
from __future__ import annotations

from .graph import BlockGraph, KernelGraph, Node, TensorType
from .ops import ACCUM_OPS, DTYPE_BYTES, Category, op_info
from .shapes import ShapeError, infer_type
from .smem import SMEM_BUDGET, triton_smem_bytes
from .tiling import TilingError, block_input_tile, output_shape, reduced_axes

MAX_THREADS = 1024


class GraphError(ValueError):
    pass


class Variance:
    """Where a block value lives relative to the for-loop."""
    PRE = "pre"          # loop-invariant, computed before the loop
    LOOP = "loop"        # changes every iteration
    POST = "post"        # an accumulator's final value or computed from one
    RUNNING = "running"  # an accum_max: the running max inside the loop, the final max after


def check(g: KernelGraph, arch: str = "sm_90") -> KernelGraph:
    """Raise ``GraphError`` if ``g`` is invalid; return it unchanged otherwise."""
    types: dict[str, TensorType] = {}
    for v in g.inputs:
        _define(types, v.name, v.type, f"graph {g.name!r} input")
    for idx, n in enumerate(g.nodes):
        where = f"node {idx} ({n.op} -> %{n.outs[0].name if n.outs else '?'})"
        info = op_info(n.op)
        if not info.kernel_level:
            raise GraphError(f"{where}: {n.op} may only appear inside a block graph")
        args = [_use(types, a, where) for a in n.args]
        if n.op == "customized":
            if n.block is None:
                raise GraphError(f"{where}: customized op without a block graph")
            check_block(n.block, args, [v.type for v in n.outs], arch, where)
        else:
            if n.block is not None:
                raise GraphError(f"{where}: only customized ops hold a block graph")
            _check_node_type(n, args, where)
        for v in n.outs:
            _define(types, v.name, v.type, where)
    if not g.outputs:
        raise GraphError(f"graph {g.name!r} has no outputs")
    for o in g.outputs:
        _use(types, o, "graph outputs")
    return g


def _define(types: dict, name: str, t: TensorType, where: str) -> None:
    if name in types:
        raise GraphError(f"{where}: value %{name} is defined twice")
    if t.dtype not in DTYPE_BYTES:
        raise GraphError(f"{where}: %{name} has unknown dtype {t.dtype!r}")
    if any(s <= 0 for s in t.shape):
        raise GraphError(f"{where}: %{name} has a non-positive dim in {list(t.shape)}")
    types[name] = t


def _use(types: dict, name: str, where: str) -> TensorType:
    if name not in types:
        raise GraphError(f"{where}: operand %{name} is not defined before use")
    return types[name]


def _check_node_type(n: Node, args: list[TensorType], where: str) -> None:
    if len(n.outs) != 1:
        raise GraphError(f"{where}: {n.op} has exactly one result, got {len(n.outs)}")
    if list(n.attrs) != sorted(n.attrs, key=lambda kv: kv[0]):
        raise GraphError(f"{where}: attributes must be sorted by key (use make_attrs)")
    try:
        want = infer_type(n.op, args, n.attrs)
    except ShapeError as e:
        raise GraphError(f"{where}: {e}") from None
    if want != n.out.type:
        raise GraphError(f"{where}: declared type {n.out.type.dtype}{list(n.out.type.shape)} but the op "
                         f"gives {want.dtype}{list(want.shape)}")


def block_variance(b: BlockGraph) -> dict[str, str]:
    """Classify every block value as PRE, LOOP, POST or RUNNING (see ``Variance``)."""
    var: dict[str, str] = {}
    for i in b.inputs:
        var[i.value.name] = Variance.LOOP if i.fmap != -1 else Variance.PRE
    for n in b.nodes:
        kinds = {var.get(a) for a in n.args}
        name = n.outs[0].name
        if n.op in ACCUM_OPS:
            if var.get(n.args[0]) != Variance.LOOP:
                raise GraphError(f"block node {n.op} -> %{name}: accumulates %{n.args[0]}, which does "
                                 f"not change with the for-loop")
            if n.op == "accum_sum_rescaled":
                m = next((x for x in b.nodes if x.outs[0].name == n.args[1]), None)
                if m is None or m.op != "accum_max":
                    raise GraphError(f"block node accum_sum_rescaled -> %{name}: its second operand "
                                     f"%{n.args[1]} must be an accum_max")
            var[name] = Variance.RUNNING if n.op == "accum_max" else Variance.POST
        elif Variance.LOOP in kinds:
            if Variance.POST in kinds:
                raise GraphError(f"block node {n.op} -> %{name}: mixes a loop-variant operand with an "
                                 f"accumulator's final value")
            var[name] = Variance.LOOP
        elif Variance.POST in kinds or Variance.RUNNING in kinds:
            var[name] = Variance.POST
        else:
            var[name] = Variance.PRE
    return var


def check_block(b: BlockGraph, args: list[TensorType], outs: list[TensorType], arch: str,
                where: str) -> None:
    where = f"{where} block graph"
    if any(x <= 0 for x in b.grid) or b.forloop <= 0:
        raise GraphError(f"{where}: grid {b.grid} and forloop {b.forloop} must be positive")
    if not (32 <= b.block_threads <= MAX_THREADS and b.block_threads % 32 == 0):
        raise GraphError(f"{where}: {b.block_threads} threads; expected a multiple of 32 in [32, {MAX_THREADS}]")
    types: dict[str, TensorType] = {}
    for inp in b.inputs:
        if not 0 <= inp.source < len(args):
            raise GraphError(f"{where}: input %{inp.value.name} reads arg{inp.source}, but the op has "
                             f"{len(args)} operands")
        src = args[inp.source]
        try:
            tile = block_input_tile(b, inp, src.shape)
        except TilingError as e:
            raise GraphError(f"{where}: {e}") from None
        if tile != inp.value.type.shape or src.dtype != inp.value.type.dtype:
            raise GraphError(f"{where}: input %{inp.value.name} declares {inp.value.type.dtype}"
                             f"{list(inp.value.type.shape)}; the tiling gives {src.dtype}{list(tile)}")
        _define(types, inp.value.name, inp.value.type, where)
    for n in b.nodes:
        nwhere = f"{where} node {n.op} -> %{n.outs[0].name if n.outs else '?'}"
        if not op_info(n.op).block_level:
            raise GraphError(f"{nwhere}: {n.op} cannot appear in a block graph")
        targs = [_use(types, a, nwhere) for a in n.args]
        _check_node_type(n, targs, nwhere)
        _define(types, n.out.name, n.out.type, nwhere)
    var = block_variance(b)
    if len(b.outputs) != len(outs):
        raise GraphError(f"{where}: {len(b.outputs)} block outputs for {len(outs)} op results")
    for o, want in zip(b.outputs, outs):
        t = _use(types, o.value, f"{where} output")
        if var[o.value] == Variance.LOOP:
            raise GraphError(f"{where}: output %{o.value} changes with the for-loop; accumulate it first")
        try:
            shape = output_shape(t.shape, b.grid, o.omap, what=f"output %{o.value}")
        except TilingError as e:
            raise GraphError(f"{where}: {e}") from None
        if shape != want.shape or t.dtype != want.dtype:
            raise GraphError(f"{where}: output %{o.value} writes {t.dtype}{list(shape)} but the op "
                             f"declares {want.dtype}{list(want.shape)}")
        if o.reduce not in ("none", "sum"):
            raise GraphError(f"{where}: output %{o.value} reduce {o.reduce!r}; expected 'none' or 'sum'")
        if reduced_axes(o, b.grid) and o.reduce == "none":
            raise GraphError(f"{where}: output %{o.value}: grid axes {reduced_axes(o, b.grid)} of extent > 1 "
                             f"do not tile it; map them in omap or declare reduce sum")
    for grp in b.thread_groups:
        for name in grp:
            node = next((n for n in b.nodes if n.outs[0].name == name), None)
            if node is None or op_info(node.op).category not in (Category.UNARY, Category.BINARY,
                                                                   Category.CONST) and node.op != "cast":
                raise GraphError(f"{where}: thread group member %{name} is not an elementwise node")
    smem = shared_memory_bytes(b)
    budget = SMEM_BUDGET.get(arch)
    if budget is None:
        raise GraphError(f"unknown arch {arch!r}; known: {', '.join(SMEM_BUDGET)}")
    if smem > budget:
        raise GraphError(f"{where}: needs {smem} bytes of shared memory (padded tiles, 1 stage); "
                         f"{arch} allows {budget}")


def shared_memory_bytes(b: BlockGraph) -> int:
    """Least shared memory ``b``'s kernel needs at any launch config: its Triton rendering with one
    stage (no pipelined copies), at the padded tile shapes the renderer uses (``smem``)."""
    return triton_smem_bytes(b, num_stages=1)
