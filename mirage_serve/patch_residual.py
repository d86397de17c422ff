"""The decoder layer's two residual adds, fused into o_proj and down_proj (``PatchOptions.fused_residual``).

A Llama-style layer computes ``h = x + o_proj(attn(norm(x)))`` and ``h + down_proj(mlp(norm(h)))``:
two torch add kernels per layer (64 per Llama-3-8B decode step, ~1.7 µs each in the eighth session's
batch-8 profile, and each one breaks the chain of programmatic dependent launches between our kernels). Here the projection sites
are prepared as ``(x, r) -> r + x Wᵀ`` programs (``sites.ProjSite(residual=True)``: searched,
verified and cached like any other), and the layer's ``forward`` is replaced by one that hands
the residual ``r`` to the projection instead of adding it afterwards.

The replacement is installed only where it is the layer's own forward, statement for statement:
the class's ``forward`` must parse to one of ``LAYER_TEMPLATES`` (annotations and docstrings aside) —
the same text in Llama, Mistral, Qwen2 and Qwen3 on transformers 5.17–5.23, and again from 5.24 with
the cache argument renamed ``cache`` (``LAYER_TEMPLATES`` holds both spellings) — and the attention
and MLP must return their projection's output unchanged (``… = self.o_proj(…)`` then ``return
…, …``; ``return self.down_proj(…)``). At run time a hand-off (``ResidualSlot``) makes the fusion
safe call by call: the projection takes the residual only when it runs its kernel on that call,
and the layer adds the residual itself whenever the projection did not (prefill-sized inputs,
a fallback, another module in between); a projection output that does not come back to the layer
unchanged raises rather than let a residual be added twice.
"""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import torch
from torch.nn.modules import module as nn_module

from .hf_names import CACHE_KWARG, CACHE_KWARGS

_LAYER_TEXT = '''
def forward(self, hidden_states, attention_mask=None, position_ids=None, CACHE=None,
            use_cache=False, position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        CACHE=CACHE,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states
'''
# The layer forward under each transformers spelling of the cache argument (hf_names).
LAYER_TEMPLATES = tuple(_LAYER_TEXT.replace("CACHE", name) for name in CACHE_KWARGS)


def hooked(modules) -> bool:
    """Whether a forward hook (global or on one of ``modules``) could see a tensor that differs from
    the original forward's: a deferred norm's placeholder (patch_wiring), a projection's output with
    the residual already in it. transformers records ``output_hidden_states`` and ``output_attentions``
    with such hooks."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_pre_hooks or any(not _idle(h) for h in m._forward_hooks.values()) for m in modules)


def _idle(hook) -> bool:
    """A transformers output-capturing hook that records nothing on this call: installed on the
    layers by the first ``output_hidden_states`` (or ``output_attentions``) call and left there, it
    records only the outputs the current call asked for. (Private transformers API: anything
    unexpected counts the hook as active.)"""
    if getattr(hook, "__name__", "") != "output_capturing_hook":
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
        key = hook.__closure__[hook.__code__.co_freevars.index("key")].cell_contents
        collected = _active_collector.get()
    except (ImportError, AttributeError, ValueError, IndexError, TypeError):
        return False
    return collected is None or key not in collected


class ResidualSlot:
    """Hands one residual from a layer's forward to one projection call, and says whether it was used."""

    __slots__ = ("residual", "out", "proj")

    def __init__(self, proj: torch.nn.Module | None = None):
        self.residual = self.out = None
        self.proj = proj  # the projection module it feeds (its hooks matter)

    def offer(self, r: torch.Tensor) -> None:
        self.residual, self.out = r, None

    def take(self) -> torch.Tensor | None:
        """The residual offered for this call (once), or None."""
        r, self.residual = self.residual, None
        return r

    def clear(self) -> None:
        self.residual = self.out = None

    def added(self, returned: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + returned``, unless the projection already added it into ``returned``."""
        out = self.out
        self.clear()
        if out is None:
            return residual + returned
        if returned is not out:
            raise RuntimeError("mirage_serve: a projection that added the layer's residual in its kernel did "
                               "not return its output to the layer unchanged; unpatch() the model and report "
                               "this model type")
        return returned


def proj_forward(module: torch.nn.Module, runtime, slot: ResidualSlot):
    """``module.forward`` running ``r + x Wᵀ`` in one kernel when ``slot`` holds a residual for it."""
    original = module.forward

    def forward(x, *args, **kwargs):
        r = slot.take()
        if r is None or args or kwargs or not runtime.eligible(module, x, r):
            return original(x, *args, **kwargs)
        out = runtime.run(x, r)[0]
        slot.out = out
        return out
    forward.residual_slot = slot  # for a caller that must see the projection alone (attention_fast)
    return forward


def layer_forward(layer: torch.nn.Module, attn: ResidualSlot | None, mlp: ResidualSlot | None):
    """``LAYER_TEMPLATES`` with each residual handed to its projection (a missing slot: the add).

    ``cache`` is the fourth positional parameter under both spellings; a caller passing it by
    keyword under the other spelling leaves it in ``kwargs``, which go on to the attention as
    they are (transformers' deprecation shim there maps the old name)."""
    attn, mlp = attn or ResidualSlot(), mlp or ResidualSlot()
    watched = [layer, layer.self_attn, layer.mlp] + [m for m in (attn.proj, mlp.proj) if m is not None]

    def forward(hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        if cache is not None:
            kwargs[CACHE_KWARG] = cache
        # A hook may read the projections' outputs or keep the layer's (hidden states are
        # recorded so): then nothing is offered and the layer adds as the original does.
        fuse = not hooked(watched)
        residual = hidden_states
        hidden_states = layer.input_layernorm(hidden_states)
        if fuse:
            attn.offer(residual)
        try:
            hidden_states, _ = layer.self_attn(
                hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=use_cache, position_embeddings=position_embeddings,
                **kwargs)
            hidden_states = attn.added(hidden_states, residual)
            residual = hidden_states
            hidden_states = layer.post_attention_layernorm(hidden_states)
            if fuse:
                mlp.offer(residual)
            hidden_states = layer.mlp(hidden_states)
            return mlp.added(hidden_states, residual)
        finally:  # nothing offered outlives the call (an exception, a projection never called)
            attn.clear()
            mlp.clear()
    return forward


def unsupported(layer: torch.nn.Module, attn_path: str, mlp_path: str) -> str | None:
    """Why ``layer``'s residual adds cannot be fused (its forward is none of ``LAYER_TEMPLATES``, or its
    attention / MLP does not return its projection's output as it is), or None."""
    return _unsupported(type(layer), type(layer.get_submodule(attn_path)), type(layer.get_submodule(mlp_path)))


@functools.lru_cache(maxsize=None)
def _unsupported(layer_cls: type, attn_cls: type, mlp_cls: type) -> str | None:
    fn = _function(layer_cls.forward)
    templates = {_normalized(ast.parse(text).body[0]) for text in LAYER_TEMPLATES}
    if fn is None or _normalized(fn) not in templates:
        return f"{layer_cls.__qualname__}.forward is not the Llama-style layer forward this fusion mirrors"
    if not _returns_projection(_function(attn_cls.forward), "o_proj", tuple_first=True):
        return f"{attn_cls.__qualname__}.forward does not return o_proj's output as it is"
    if not _returns_projection(_function(mlp_cls.forward), "down_proj", tuple_first=False):
        return f"{mlp_cls.__qualname__}.forward does not return down_proj's output as it is"
    return None


def _function(fn) -> ast.FunctionDef | None:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source (compiled, built in): not fused
        return None
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, ast.FunctionDef) else None


def _normalized(fn: ast.FunctionDef) -> str:
    """The function without annotations, decorators and docstring, as an AST dump."""
    fn = ast.parse(ast.unparse(fn)).body[0]  # a copy
    fn.decorator_list, fn.returns = [], None
    for a in fn.args.args + fn.args.kwonlyargs + [x for x in (fn.args.vararg, fn.args.kwarg) if x]:
        a.annotation = None
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        fn.body = body[1:]
    return ast.dump(fn, annotate_fields=False)


def _is_call_of(node, attr: str) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and f.attr == attr and isinstance(f.value, ast.Name)
            and f.value.id == "self")


def _returns_projection(fn: ast.FunctionDef | None, attr: str, tuple_first: bool) -> bool:
    """Whether ``fn`` ends by returning ``self.<attr>(…)``'s result untouched (first of a tuple, or
    alone), directly or through one assignment just before the return."""
    if fn is None or not fn.body or not isinstance(fn.body[-1], ast.Return):
        return False
    value = fn.body[-1].value
    if tuple_first:
        if not isinstance(value, ast.Tuple) or not value.elts:
            return False
        value = value.elts[0]
    if _is_call_of(value, attr):
        return True
    if not isinstance(value, ast.Name) or len(fn.body) < 2:
        return False
    prev = fn.body[-2]
    return (isinstance(prev, ast.Assign) and len(prev.targets) == 1 and isinstance(prev.targets[0], ast.Name)
            and prev.targets[0].id == value.id and _is_call_of(prev.value, attr))
