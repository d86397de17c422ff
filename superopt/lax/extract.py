"""Extract a Lax program from a torch module by tracing it with ``torch.export``.

The math of a patched block comes from the model's own code: the module is exported, and each
aten op of the FX graph is mapped to ops of the Lax builder (``superopt.lax.Program``). Every
result is checked against the shape and dtype torch recorded for it (``node.meta["val"]``); a dtype
difference (type promotion, ``.to``) becomes an explicit ``cast``. An aten op with no mapping
raises ``ExtractError`` naming it, so the caller can report the block as not patchable.

Parameters and buffers become program inputs named after their path in the traced module
(``head.weight`` → ``%head_weight``), so identical blocks of different layers give identical
programs (one digest, one search). A tensor the module writes in place (a KV cache's
``index_copy_``) becomes one more output, after the module's own, holding its new value.

torch is imported here only: this module is an edge of ``superopt`` (docs/architecture.md "Import direction").
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ir import DTYPE_BYTES
from . import Program, T

__all__ = ["ExtractError", "Extracted", "extract"]

# the IR names dtypes as torch does; int64 only for positions (gather / scatter)
_DTYPES = {getattr(torch, name): name for name in DTYPE_BYTES}


class ExtractError(ValueError):
    """The traced module uses something the Lax builder cannot express (the message names it)."""


@dataclass(frozen=True)
class Extracted:
    """A program and, per program input, where its tensor comes from.

    ``sources[i]`` is ``("arg", k)`` for the k-th positional argument of the module, or
    ``("param", path)`` / ``("buffer", path)`` for a tensor of the traced module.
    """

    graph: Any  # superopt.ir.KernelGraph
    sources: tuple[tuple[str, Any], ...]


def extract(module: torch.nn.Module, example_args: tuple, name: str = "program") -> Extracted:
    """Trace ``module(*example_args)`` (tensors only) and build the equivalent Lax program."""
    try:
        ep = torch.export.export(module, tuple(example_args))
    except Exception as e:  # export failures are as varied as the code being traced
        raise ExtractError(f"torch.export could not trace {type(module).__name__}: "
                           f"{type(e).__name__}: {e}".splitlines()[0]) from e
    return _walk(ep, name)


def _dtype(t: torch.dtype) -> str:
    try:
        return _DTYPES[t]
    except KeyError:
        raise ExtractError(f"tensor dtype {t} is not supported (supported: "
                           f"{', '.join(_DTYPES.values())})") from None


def _walk(ep, name: str) -> Extracted:
    sig = ep.graph_signature
    roles: dict[str, tuple[str, Any]] = {}
    for spec in sig.input_specs:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            roles[spec.arg.name] = ("arg", len([r for r in roles.values() if r[0] == "arg"]))
        elif kind in ("PARAMETER", "BUFFER"):
            roles[spec.arg.name] = (kind.lower(), spec.target)
        else:
            raise ExtractError(f"traced module has a {kind.lower()} input {spec.arg.name!r}; "
                               f"only parameters, buffers and tensor arguments are supported")
    p = Program(name)
    env: dict[str, Any] = {}
    sources: list[tuple[str, Any]] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta["val"]
            role = roles[node.name]
            pname = str(role[1]).replace(".", "_") if role[0] != "arg" else f"x{role[1]}"
            env[node.name] = p.input(pname, tuple(val.shape), _dtype(val.dtype))
            sources.append(role)
        elif node.op == "call_function":
            env[node.name] = _call(p, node, env)
        elif node.op == "output":
            outs = node.args[0]
            for o in outs:
                if not isinstance(o, torch.fx.Node) or not isinstance(env.get(o.name), T):
                    raise ExtractError(f"output {o} is not a tensor computed by the program")
                p.output(env[o.name])
            for m in dict.fromkeys(env.get(_MUTATED, ())):  # in-place writes (a cache's index_copy_)
                if env[m].name not in {env[o.name].name for o in outs}:
                    p.output(env[m])
        else:
            raise ExtractError(f"unsupported FX node kind {node.op!r} ({node.name})")
    return Extracted(p.build(), tuple(sources))


_MUTATED = "__mutated__"  # env key: names of tensors written in place, in order


def _call(p: Program, node, env: dict) -> Any:
    target = node.target
    if target is operator.getitem:
        seq, i = node.args
        return env[seq.name][i]
    key = str(target)
    if key in _IGNORED:
        return None
    rule = _RULES.get(key)
    if rule is None:
        raise ExtractError(f"aten op {key} has no Lax mapping (in node {node.name!r}); "
                           f"the block cannot be extracted")

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    out = rule(p, node, *[arg(a) for a in node.args], **{k: arg(v) for k, v in node.kwargs.items()})
    if key.endswith("_.default") and node.args and isinstance(node.args[0], torch.fx.Node):
        # An in-place op (StaticCache's index_copy_) the export kept: later readers of the tensor
        # see the new value, and the new value is an output of the program.
        env[node.args[0].name] = out
        env.setdefault(_MUTATED, []).append(node.args[0].name)
    val = node.meta.get("val")
    if isinstance(out, T) and isinstance(val, torch.Tensor):
        want = _dtype(val.dtype)
        if out.dtype != want:
            out = p.cast(out, want)
        if out.shape != tuple(val.shape):
            raise ExtractError(f"{key} in node {node.name!r}: built shape {list(out.shape)}, "
                               f"torch says {list(val.shape)}")
    return out


# ---------------------------------------------------------------- rules
# Each rule gets the program, the FX node (for its recorded shape/dtype) and the mapped args.


def _out_dtype(node) -> str:
    return _dtype(node.meta["val"].dtype)


def _operand(p: Program, node, a) -> T:
    """A tensor or Python number as a value in the node's result dtype (torch type promotion)."""
    want = _out_dtype(node)
    if isinstance(a, T):
        return a if a.dtype == want else p.cast(a, want)
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        raise ExtractError(f"{node.target}: operand {a!r} is neither a tensor nor a number")
    return p.const(float(a), want)


def _binary(op: str) -> Callable:
    def rule(p, node, a, b, alpha=1, rounding_mode=None):
        if alpha != 1 or rounding_mode is not None:
            raise ExtractError(f"{node.target} with alpha={alpha}, rounding_mode={rounding_mode} "
                               f"is not supported")
        return getattr(p, op)(_operand(p, node, a), _operand(p, node, b))
    return rule


def _unary(op: str) -> Callable:
    return lambda p, node, a: getattr(p, op)(_operand(p, node, a))


def _pow(p, node, a, e):
    a = _operand(p, node, a)
    if e == 2:
        return p.square(a)
    if e == 1:
        return a
    if e == 0.5:
        return p.sqrt(a)
    if e == -0.5:
        return p.rsqrt(a)
    if e == -1:
        return p.div(p.const(1.0, a.dtype), a)
    raise ExtractError(f"{node.target} with exponent {e!r} has no Lax mapping")


def _reduce(kind: str) -> Callable:
    def rule(p, node, a, dims=None, keepdim=False, dtype=None):
        if dims is None or len(dims) != 1:
            raise ExtractError(f"{node.target} over dims {dims} is not supported (one dim only)")
        if dtype is not None:
            a = p.cast(a, _dtype(dtype))
        return getattr(p, kind)(a, dims[0], keepdim)
    return rule


def _linear(p, node, x, w, b=None):
    y = p.matmul(x, p.transpose(w))  # x: [..., K], w: [N, K]
    return y if b is None else p.add(y, b)


def _addmm(p, node, b, x, w, beta=1, alpha=1):
    if beta != 1 or alpha != 1:
        raise ExtractError(f"{node.target} with beta={beta}, alpha={alpha} is not supported")
    return p.add(p.matmul(x, w), b)


def _transpose(p, node, a, d0=-2, d1=-1):
    r = a.type.rank
    if {d0 % r, d1 % r} != {r - 2, r - 1}:
        raise ExtractError(f"{node.target} of dims ({d0}, {d1}) of a rank-{r} tensor is not supported "
                           f"(only the last two)")
    return p.transpose(a)


def _permute(p, node, a, perm):
    r = a.type.rank
    perm = [d % r for d in perm]
    if perm == list(range(r)):
        return a
    if perm == list(range(r - 2)) + [r - 1, r - 2]:
        return p.transpose(a)
    raise ExtractError(f"{node.target} with permutation {perm} is not supported")


def _view(p, node, a, *rest, **kw):
    shape = tuple(node.meta["val"].shape)
    return a if shape == a.shape else p.reshape(a, shape)


def _identity(p, node, a, *rest, **kw):
    return a


def _dropout(p, node, a, prob, train):
    if train and prob:
        raise ExtractError(f"{node.target} in training mode cannot be extracted")
    return a


def _cast(p, node, a, *rest, **kw):
    want = _out_dtype(node)
    return a if a.dtype == want else p.cast(a, want)


def _gelu(p, node, a, approximate="none"):
    if approximate != "tanh":
        raise ExtractError(f"{node.target} with approximate={approximate!r} has no Lax mapping "
                           f"(only the tanh approximation)")
    return p.gelu_tanh(a)


def _slice(p, node, a, dim=0, start=None, end=None, step=1):
    if step != 1:
        raise ExtractError(f"{node.target} with step {step} is not supported")
    n = a.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else min(start, n))
    end = n if end is None else (end + n if end < 0 else min(end, n))
    return a if (start, end) == (0, n) else p.slice(a, dim, start, end)


def _split_sizes(p, a, sizes, dim):
    return p.split(a, list(sizes), dim) if len(sizes) > 1 else [a]


def _split(p, node, a, size, dim=0):
    n = a.shape[dim]
    return _split_sizes(p, a, [min(size, n - s) for s in range(0, n, size)], dim)


def _split_with_sizes(p, node, a, sizes, dim=0):
    return _split_sizes(p, a, sizes, dim)


def _chunk(p, node, a, chunks, dim=0):
    n = a.shape[dim]
    size = -(-n // chunks)
    return _split(p, node, a, size, dim)


def _rsub(p, node, a, b, alpha=1):
    return _binary("sub")(p, node, b, a, alpha)


_RULES: dict[str, Callable] = {
    "aten.add.Tensor": _binary("add"), "aten.sub.Tensor": _binary("sub"),
    "aten.mul.Tensor": _binary("mul"), "aten.div.Tensor": _binary("div"),
    "aten.add.Scalar": _binary("add"), "aten.mul.Scalar": _binary("mul"),
    "aten.rsub.Scalar": _rsub, "aten.rsub.Tensor": _rsub,
    "aten.exp.default": _unary("exp"), "aten.neg.default": _unary("neg"),
    "aten.sqrt.default": _unary("sqrt"), "aten.rsqrt.default": _unary("rsqrt"),
    "aten.silu.default": _unary("silu"), "aten.sigmoid.default": _unary("sigmoid"),
    "aten.tanh.default": _unary("tanh"), "aten.square.default": _unary("square"),
    "aten.gelu.default": _gelu,
    "aten.reciprocal.default": lambda p, node, a: p.div(p.const(1.0, a.dtype), a),
    "aten.pow.Tensor_Scalar": _pow,
    "aten.mean.dim": _reduce("mean"), "aten.sum.dim_IntList": _reduce("sum"),
    "aten.amax.default": _reduce("max"),
    "aten.linear.default": _linear, "aten.addmm.default": _addmm,
    "aten.mm.default": lambda p, node, a, b: p.matmul(a, b),
    "aten.bmm.default": lambda p, node, a, b: p.matmul(a, b),
    "aten.matmul.default": lambda p, node, a, b: p.matmul(a, b),
    "aten.t.default": _transpose, "aten.transpose.int": _transpose, "aten.permute.default": _permute,
    "aten.view.default": _view, "aten.reshape.default": _view, "aten._unsafe_view.default": _view,
    "aten.unsqueeze.default": _view, "aten.squeeze.dim": _view, "aten.flatten.using_ints": _view,
    "aten.clone.default": _identity, "aten.contiguous.default": _identity,
    "aten.alias.default": _identity, "aten.detach.default": _identity,
    "aten.dropout.default": _dropout,
    "aten.to.dtype": _cast, "aten.to.dtype_layout": _cast, "aten._to_copy.default": _cast,
    "aten.type_as.default": _cast,
    "aten.slice.Tensor": _slice, "aten.split.Tensor": _split,
    "aten.split_with_sizes.default": _split_with_sizes, "aten.chunk.default": _chunk,
    "aten.cat.default": lambda p, node, xs, dim=0: xs[0] if len(xs) == 1 else p.concat(list(xs), dim),
}

# ---- activations and LayerNorm (issue 27, search-ops)
def _gelu_any(p, node, a, approximate="none"):
    return p.gelu(_operand(p, node, a)) if approximate == "none" else _gelu(p, node, a, approximate)


def _layer_norm(p, node, a, shape, weight=None, bias=None, eps=1e-5, *rest):
    if len(shape) != 1:
        raise ExtractError(f"{node.target} over {len(shape)} dims is not supported (the last dim only)")
    return p.layer_norm(a, weight, bias, eps)


def _pow_any(p, node, a, e):
    if e == 3:  # HF's NewGELU writes torch.pow(x, 3.0)
        a = _operand(p, node, a)
        return p.mul(p.mul(a, a), a)
    return _pow(p, node, a, e)


_RULES.update({
    "aten.pow.Tensor_Scalar": _pow_any,
    "aten.gelu.default": _gelu_any, "aten.relu.default": _unary("relu"), "aten.erf.default": _unary("erf"),
    "aten.layer_norm.default": _layer_norm,
})
# ---- end of the activations block

# Runtime assertions torch.export inserts; they compute nothing.
_IGNORED = frozenset({"aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
                      "aten.sym_constrain_range_for_size.default"})

from .movement import MOVEMENT_RULES  # noqa: E402  (its rules build on this module's errors)

_RULES.update(MOVEMENT_RULES)  # permutes of any dims, head repeats, gathers, cache writes
