"""A decoder layer class's ``forward`` with its arithmetic routed through helpers (patching/residual.py).

    rw = rewrite(type(layer))              # or a one-line reason it cannot be rewritten
    forward = bind(rw, layer, add, scale)  # every a + b -> add(k, a, b); a * b, a / b -> scale(j, op, a, b)

The rewritten function is compiled from the original's source in the original module's globals,
decorators and line numbers kept; the helpers are closure cells of each bound copy, so nothing is
added to the module and torch.compile traces it as it would the original. With helpers that
compute what they are given, it computes what the original does.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass

from torch import nn

__all__ = ["Rewritten", "bind", "rewrite", "scaled"]

_ADD = "_mirage_add"  # the name the rewritten forward calls each ``a + b`` through
_SCALE = "_mirage_scale"  # ... and each ``a * b`` / ``a / b`` (a branch's scale, Granite's residual multiplier)


class _Ops(ast.NodeTransformer):
    """In the function's own body (not nested functions): ``a + b`` -> ``_mirage_add(k, a, b)``, and
    ``a * b`` / ``a / b`` -> ``_mirage_scale(j, "mul" / "div", a, b)``."""

    def __init__(self):
        self.adds = self.scales = 0  # rewritten so far: the next one's k, j

    def visit_BinOp(self, node: ast.BinOp):
        self.generic_visit(node)
        if isinstance(node.op, ast.Add):
            k, self.adds = self.adds, self.adds + 1
            call = ast.Call(ast.Name(_ADD, ast.Load()), [ast.Constant(k), node.left, node.right], [])
        elif isinstance(node.op, (ast.Mult, ast.Div)):
            j, self.scales = self.scales, self.scales + 1
            op = "mul" if isinstance(node.op, ast.Mult) else "div"
            call = ast.Call(ast.Name(_SCALE, ast.Load()), [ast.Constant(j), ast.Constant(op), node.left, node.right], [])
        else:
            return node
        return ast.copy_location(call, node)

    def visit_Lambda(self, node):  # a nested function keeps its own adds
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda


@dataclass(frozen=True)
class Rewritten:
    factory: object         # factory(add, scale) -> the rewritten forward, decorated, its arithmetic through them
    first_arg: str          # the hidden-states parameter (after self)


@functools.lru_cache(maxsize=None)
def rewrite(cls: type) -> Rewritten | str:
    """``cls.forward`` with every ``+`` routed through ``_mirage_add`` and every ``*``, ``/`` through
    ``_mirage_scale``, or why it cannot be."""
    fn = inspect.unwrap(cls.forward)
    where = f"{cls.__qualname__}.forward"
    if getattr(fn, "__code__", None) is None:
        return f"{where} has no Python code"
    if fn.__code__.co_freevars:  # super() or a closure: the rewritten copy would not have its cells
        return f"{where} uses a closure or super() ({', '.join(fn.__code__.co_freevars)})"
    try:
        lines, first_line = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError) as e:
        return f"{where} has no readable source ({type(e).__name__})"
    fdef = tree.body[0] if tree.body else None
    if not isinstance(fdef, ast.FunctionDef) or len(fdef.args.args) < 2:
        return f"{where} is not a method taking the hidden states"
    rewriter = _Ops()
    fdef.body = [rewriter.visit(s) for s in fdef.body]
    if not rewriter.adds:
        return f"{where} adds nothing (no residual add to move)"
    # def _mirage_factory(_mirage_add, _mirage_scale): <the decorated forward>; return forward
    factory = ast.parse(f"def _mirage_factory({_ADD}, {_SCALE}):\n    return {fdef.name}").body[0]
    factory.body.insert(0, fdef)
    tree.body = [ast.copy_location(factory, fdef)]
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, first_line - 1)  # tracebacks point at the original lines
    code = compile(tree, inspect.getsourcefile(fn) or "<rewritten forward>", "exec")
    defined: dict = {}
    exec(code, fn.__globals__, defined)  # the module's own globals: nothing is added to them
    return Rewritten(defined["_mirage_factory"], fdef.args.args[1].arg)


def bind(rw: Rewritten, layer: nn.Module, add, scale=None):
    """The rewritten forward bound to ``layer``, its adds going through ``add(k, a, b)`` and its
    products and quotients through ``scale(j, op, a, b)`` (default: computed as written)."""
    return rw.factory(add, scale or scaled).__get__(layer)


def scaled(j, op, a, b):
    return a * b if op == "mul" else a / b
