"""Sites: the blocks of a decoder layer that patch() fuses, as family adapters declare them.

An adapter (``patches/<model_type>.py``) names modules only; it never writes a formula. Two kinds
of site cover the decoder layer of every supported family:

* ``NormSite``: an RMSNorm and the modules that consume its output (q/k/v projections; the MLP
  up to its down projection). Traced as ``n = norm(x); (n, c1(n), c2(n), …)`` where a consumer
  with a ``tail`` is traced with that child replaced by the identity (``mlp`` without
  ``down_proj`` is ``act(gate(n)) * up(n)``, however the family writes it).
* ``ProjSite``: one projection alone (``o_proj``, ``down_proj``), or a block on an input no norm
  feeds, up to its ``tail`` (OLMo-2's post-norm MLP: ``act(gate(h)) * up(h)``, then ``down_proj``).

The traced wrapper (`SiteModule`) holds the model's own modules (or shallow copies that share their
parameters), so extraction sees the real parameters and nothing is copied.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from torch import nn

from .stacking import stack_linears, stackable


@dataclass(frozen=True)
class Consumer:
    path: str                 # module path relative to the decoder layer, e.g. "self_attn.q_proj"
    tail: str | None = None   # child applied after the kernel (traced as identity), e.g. "down_proj"


@dataclass(frozen=True)
class NormSite:
    name: str
    norm: str
    consumers: tuple[Consumer, ...]

    def paths(self) -> tuple[str, ...]:
        return (self.norm,) + tuple(c.path for c in self.consumers)


@dataclass(frozen=True)
class ProjSite:
    name: str
    proj: str
    residual: bool = False  # traced as ``(x, r) -> proj(x) + r``: the layer's residual add fused in
    tail: str | None = None  # a block's child applied after the kernel (traced as identity), as Consumer.tail
    # with ``residual``: the norm the layer applies to the projection's output before adding it (Gemma's
    # post-attention norm, a path in the layer), traced as ``(x, r) -> r + post(proj(x))``
    post: str | None = None
    # with ``residual``: ("mul" / "div", factor) the layer scales the projection's output by before adding
    # it (Granite's residual multiplier), traced as ``(x, r) -> r + proj(x) * factor``
    post_scale: tuple[str, float] | None = None
    # the output leaves the model (the final norm's ``last_hidden_state``, ``patching.final_norm``): it is
    # handed out as a copy outside CUDA-graph capture, as the kernel reuses its output buffer
    escapes: bool = False

    def paths(self) -> tuple[str, ...]:
        return (self.proj,) + ((self.post,) if self.post else ())


@dataclass(frozen=True)
class Family:
    """What an adapter declares: where the decoder layers are and which sites each has."""

    model_types: tuple[str, ...]
    layers: tuple[str, ...]                       # candidate paths of the layer list, first found wins
    sites: tuple[NormSite | ProjSite, ...]
    not_patched: tuple[tuple[str, str], ...] = field(default=())  # (block, why) per layer


def llama_like(model_types: tuple[str, ...], mlp_norm: str = "post_attention_layernorm",
               qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")) -> Family:
    """The site layout shared by Llama-style layers (attention + gated MLP, pre-norms)."""
    return Family(
        model_types=model_types,
        layers=("model.layers", "model.language_model.layers"),
        sites=(
            NormSite("attn_in", "input_layernorm", tuple(Consumer(f"self_attn.{p}") for p in qkv)),
            ProjSite("attn_out", "self_attn.o_proj"),
            NormSite("mlp_in", mlp_norm, (Consumer("mlp", tail="down_proj"),)),
            ProjSite("mlp_out", "mlp.down_proj"),
        ),
    )


def find_layers(model: nn.Module, family: Family) -> tuple[str, nn.ModuleList] | None:
    for path in family.layers:
        try:
            layers = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(layers, nn.ModuleList):
            return path, layers
    return None


class Scale(nn.Module):
    """``y * factor`` or ``y / factor``, as the layer's forward writes a residual branch's scale."""

    def __init__(self, op: str, factor: float):
        super().__init__()
        self.op, self.factor = op, factor

    def forward(self, y):
        return y * self.factor if self.op == "mul" else y / self.factor


class SiteModule(nn.Module):
    """The traced form of a site: ``x -> (norm(x), consumer outputs…)`` or ``x -> proj(x)``;
    with ``norm_output=False``, ``x -> (consumer outputs…)``; with ``residual``, a projection
    ``(x, r) -> proj(x) + r`` (``r``: the decoder layer's residual stream, [M, out]), with a ``post``
    norm ``(x, r) -> r + post(proj(x))``."""

    def __init__(self, head: nn.Module, consumers: list[nn.Module], norm_output: bool = True,
                 residual: bool = False, post: nn.Module | None = None):
        super().__init__()
        self.head = head
        self.consumers = nn.ModuleList(consumers)
        self.norm_output = norm_output
        self.residual = residual
        self.post = post

    def forward(self, x, r=None):  # x: [M, D]
        if self.residual:
            y = self.head(x)
            return (r + (y if self.post is None else self.post(y)),)  # the layer's order: residual + hidden
        if not len(self.consumers):
            return (self.head(x),)
        n = self.head(x)
        outs = tuple(c(n) for c in self.consumers)
        return (n, *outs) if self.norm_output else outs


def site_parts(name: str, wrapper: SiteModule, stack: bool = False
               ) -> list[tuple[str, SiteModule, tuple[int, ...]]]:
    """The programs site ``name`` is optimized as: (program name, module, which of the site's
    outputs it computes), in the order they are prepared; together they compute every output.

    A norm site splits: each consumer alone (``x -> consumer(norm(x))``: q, k, v; or the gated
    MLP), and the norm alone (``x -> n``). A memory-bound decode GEMV wants its grid over output
    columns, and one grid can only tile one weight's columns: consumers grouped into one program
    (k and v) leave the search nothing but split-K, which reads narrow strips of every weight row
    and sums with atomics (25% of bandwidth on Llama-3-8B's k/v). The norm alone is one small
    row-wise kernel. Consumers with equal structure (k and v) get one program name, so they are
    one program, searched and built once; norms of one shape are one program ("norm").

    ``stack``: the plain ``nn.Linear`` consumers (q, k, v) are one part instead, their weights
    stacked into one (``stacking``): one weight, so one grid tiles all their columns. That part's
    program has one output, the consumers' outputs side by side (``stacked_widths``).
    """
    if not len(wrapper.consumers):  # a norm alone (the model's final norm) is the program "norm" too
        alone_norm = not wrapper.residual and not any(isinstance(m, nn.Linear) for m in wrapper.head.modules())
        return [("norm" if alone_norm else name, wrapper, (0,))]
    modules = list(wrapper.consumers)  # one a part, in site order
    outputs = [(1 + i,) for i in range(len(modules))]
    linear = [i for i, c in enumerate(modules) if type(c) is nn.Linear]
    if stack and stackable([modules[i] for i in linear]):
        keep = [i for i in range(len(modules)) if i == linear[0] or i not in linear]
        modules[linear[0]] = stack_linears([modules[i] for i in linear])
        outputs[linear[0]] = tuple(1 + i for i in linear)
        modules, outputs = [modules[i] for i in keep], [outputs[i] for i in keep]
    labels: dict[tuple, str] = {}
    parts = []
    for c, outs in zip(modules, outputs):
        label = labels.setdefault(signature(c), name if not labels else f"{name}_{len(labels)}")
        parts.append((label, SiteModule(wrapper.head, [c], norm_output=False), outs))
    return parts + [("norm", SiteModule(wrapper.head, []), (0,))]


def stacked_widths(wrapper: SiteModule, outputs: tuple[int, ...]) -> tuple[int, ...]:
    """The output widths of the consumers a part of ``site_parts`` computes as one stacked
    projection (its ``outputs``, more than one), in order; () for a part with one output."""
    if len(outputs) < 2:
        return ()
    return tuple(wrapper.consumers[o - 1].out_features for o in outputs)


def _without(module: nn.Module, child: str) -> nn.Module:
    """A shallow copy of ``module`` whose ``child`` is the identity; parameters are shared."""
    twin = copy.copy(module)
    twin._modules = dict(module._modules)  # a new dict: the original module stays untouched
    twin._modules[child] = nn.Identity()
    return twin


def site_module(layer: nn.Module, site: NormSite | ProjSite) -> SiteModule:
    if isinstance(site, ProjSite):
        proj = layer.get_submodule(site.proj)
        post = layer.get_submodule(site.post) if site.post else Scale(*site.post_scale) if site.post_scale else None
        return SiteModule(_without(proj, site.tail) if site.tail else proj, [], residual=site.residual, post=post)
    cons = [layer.get_submodule(c.path) for c in site.consumers]
    cons = [_without(m, c.tail) if c.tail else m for m, c in zip(cons, site.consumers)]
    return SiteModule(layer.get_submodule(site.norm), cons)


_PRIMITIVE = (int, float, str, bool, type(None))


def signature(module: nn.Module) -> tuple:
    """A structural key: module types, their scalar attributes, parameter shapes and dtypes.

    Two sites with equal signatures trace to the same program, so extraction runs once for all
    layers of a model (eps, activation choice and sizes are scalar attributes of the modules).
    """
    parts: list = []
    for name, m in module.named_modules():
        attrs = tuple(sorted((k, v) for k, v in vars(m).items()
                             if not k.startswith("_") and isinstance(v, _PRIMITIVE)))
        parts.append((name, type(m).__module__, type(m).__qualname__, attrs))
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        parts.append((name, tuple(t.shape), str(t.dtype)))
    return tuple(parts)


def unsupported_layers(module: nn.Module) -> str | None:
    """Why the site's modules cannot be patched (quantized or foreign linears), or None."""
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear) and type(m) is not nn.Linear:
            return f"quantized or unsupported layer type {type(m).__qualname__} at {name or 'site'}"
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if not t.is_floating_point():
            return f"parameter {name} has dtype {t.dtype} (quantized?); only float weights are fused"
    return None
