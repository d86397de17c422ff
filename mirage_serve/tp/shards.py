"""patch() on a model sharded by HF's tp_plan: per-shard views to search on, and the all-reduce after row-wise kernels.

HF's tensor parallelism (``from_pretrained(..., tp_plan="auto")`` under torchrun, or
``hf_shard.shard_in_place``) turns each planned Linear's weight into a DTensor: column-wise
(``Shard(0)``: q / k / v / gate / up, each rank holds some output features) or row-wise
(``Shard(1)``: o / down, each rank holds some input features and produces a partial sum that HF
all-reduces). It sets the module's ``forward`` to its own TP forward, which on an inference call
runs the plain Linear on the local shard (and all-reduces after a row-wise one).

patch() then works on shards (``Sharding``):

* ``view(layer)``: the decoder layer as this rank sees it, the same module tree with every DTensor
  weight replaced by its local tensor (same storage: no weight is copied) and the Linear's
  ``in_features`` / ``out_features`` set to the shard's. Sites are traced, searched, cached and
  self-checked on the view, so every kernel is searched for its shard's shape.
* ``wrap(site, runtime)``: a projection site whose weight is row-wise returns a partial sum; its
  runtime all-reduces the output through torch.distributed (NCCL on GPU, gloo on CPU) on the
  current stream, so the decode CUDA graph captures it.
* ``config``: the model config with this rank's head counts, for the owned static KV cache and the
  decode-attention kernels (attention heads are split across ranks with q / k / v).

Every rank takes the same decisions on the same shapes, and ``agree`` makes sure of it for the
sites: only a site prepared on every rank is installed (with the residual folded into rank 0's
kernel, one rank running HF's forward instead would add the residual twice or never).
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
from dataclasses import dataclass, field

import torch
from torch import nn


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return None
    return DTensor


def sharded_params(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    DTensor = _dtensor_type()
    if DTensor is None:
        return []
    return [(n, p) for n, p in model.named_parameters() if isinstance(p, DTensor)]


def _shard_dim(p) -> int | None:
    """The dim of a DTensor weight its mesh splits (0 column-wise, 1 row-wise), or None if replicated."""
    from torch.distributed.tensor import Shard

    dims = [pl.dim % p.dim() for pl in p.placements if isinstance(pl, Shard)]
    return dims[0] if dims else None


def divides(config, world: int) -> str | None:
    """Why ``world`` ranks cannot split this model's heads and MLP evenly, or None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    sizes = {"query heads": heads, "kv heads": getattr(text, "num_key_value_heads", None) or heads,
             "intermediate size": getattr(text, "intermediate_size", None)}
    bad = [f"{what} {n}" for what, n in sizes.items() if isinstance(n, int) and n % world]
    if bad:
        return (f"tensor-parallel world size {world} does not divide the {', '.join(bad)}; "
                f"choose a --tp that divides them")
    return None


def local_config(config, world: int):
    """``config`` with this rank's head counts (q and kv heads ÷ ``world``; the head dim kept)."""
    out = copy.deepcopy(config)
    text = out.get_text_config() if hasattr(out, "get_text_config") else out
    hq = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // hq
    text.head_dim = head_dim
    text.num_attention_heads = hq // world
    if getattr(text, "num_key_value_heads", None):
        text.num_key_value_heads //= world
    return out


def shard_shaped_config(config, world: int):
    """A config whose whole model has one rank's shapes (heads and MLP ÷ ``world``): a model built
    from it traces to the same site programs as a real shard view, so its kernels can be searched
    and cached with no second GPU (``mirage-serve warm --tp N``, ``simulated``)."""
    out = local_config(config, world)
    text = out.get_text_config() if hasattr(out, "get_text_config") else out
    text.intermediate_size //= world
    return out


_SIMULATED: contextvars.ContextVar[int | None] = contextvars.ContextVar("mirage_serve_tp_simulated", default=None)


@contextlib.contextmanager
def simulated(world: int):
    """patch() inside this context treats an unsharded model built from ``shard_shaped_config`` as
    one rank of ``world``: cache keys carry the world size, exactly as on a real shard, so the
    kernels it searches serve the sharded model later. Nothing is all-reduced (there is no other
    rank)."""
    token = _SIMULATED.set(int(world))
    try:
        yield
    finally:
        _SIMULATED.reset(token)


def _local_module(module: nn.Module, DTensor) -> nn.Module:
    """A shallow copy of ``module`` (children copied the same way) whose DTensor parameters are
    their local shards and whose instance ``forward`` (HF's TP forward) is dropped."""
    twin = copy.copy(module)
    twin.__dict__.pop("forward", None)
    twin._parameters = {}
    for name, p in module._parameters.items():
        if isinstance(p, DTensor):
            p = nn.Parameter(p.to_local(), requires_grad=False)
        twin._parameters[name] = p
    twin._buffers = dict(module._buffers)
    twin._modules = {n: (None if c is None else _local_module(c, DTensor)) for n, c in module._modules.items()}
    if isinstance(twin, nn.Linear) and twin._parameters.get("weight") is not None:
        twin.out_features, twin.in_features = twin._parameters["weight"].shape
    return twin


class Reduced:
    """A projection site's runtime whose output is a partial sum over ranks: all-reduced after the kernel.

    With the layer's residual fused in (``patching.residual``: the program ``(x, r) -> r + x Wᵀ``), rank 0
    runs it with the residual and every other rank with ``r = 0``, so the all-reduce adds the
    residual exactly once: the add after the all-reduce is gone, and so is its kernel."""

    def __init__(self, runtime, group, rank: int):
        self.runtime, self.group, self.rank = runtime, group, rank
        self._zeros: dict[tuple, torch.Tensor] = {}  # (shape, dtype, device) -> a zero residual, never written

    def __getattr__(self, name):  # dim, dtype, device, kernels, residual_dim… of the wrapped runtime
        return getattr(self.runtime, name)

    def eligible(self, module, x, r=None) -> bool:
        return self.runtime.eligible(module, x) if r is None else self.runtime.eligible(module, x, r)

    def run(self, x, r=None):
        import torch.distributed as dist

        if r is not None and self.rank != 0:
            key = (tuple(r.shape), r.dtype, r.device)
            if key not in self._zeros:
                self._zeros[key] = torch.zeros_like(r)
            r = self._zeros[key]
        outs = self.runtime.run(x) if r is None else self.runtime.run(x, r)
        dist.all_reduce(outs[0], group=self.group)  # in place, on the current stream (graph-capturable)
        return outs


@dataclass
class Sharding:
    """What patch() needs to know about a tensor-parallel model on this rank."""

    world: int
    rank: int
    group: object
    config: object                      # this rank's head counts (local_config)
    simulated: bool = False             # a shard-shaped model on one device (``simulated``)
    device: object = None               # where this rank's tensors live (NCCL collectives need it)
    _views: dict = field(default_factory=dict)

    @property
    def tag(self) -> str:
        """The cache-key suffix: kernels for a shard are keyed by the world size too (the
        program digest already covers the shard's shapes)."""
        return f"-tp{self.world}"

    def view(self, layer: nn.Module) -> nn.Module:
        if self.simulated:  # already shard-shaped
            return layer
        v = self._views.get(id(layer))
        if v is None:
            v = self._views[id(layer)] = _local_module(layer, _dtensor_type())
        return v

    def row_wise(self, module: nn.Module) -> bool:
        w = getattr(module, "weight", None)
        return isinstance(w, _dtensor_type()) and _shard_dim(w) == w.dim() - 1

    def unsupported(self, layer: nn.Module, site) -> str | None:
        """Why a site cannot run on shards (a row-wise weight inside a fused norm site, a
        row-wise projection with a bias), or None."""
        from ..patching.sites import ProjSite

        if isinstance(site, ProjSite) and site.post:
            return "a post-norm after the projection needs the all-reduce first (it normalises the whole sum)"
        if isinstance(site, ProjSite) and site.tail is None:
            proj = layer.get_submodule(site.proj)
            if self.row_wise(proj) and getattr(proj, "bias", None) is not None:
                return "row-wise sharded projection with a bias (HF adds it after the all-reduce)"
            return None
        # a norm site's consumers, or a block site (a ProjSite up to its tail), up to their tails
        blocks = ((site.proj, site.tail),) if isinstance(site, ProjSite) else \
            tuple((c.path, c.tail) for c in site.consumers)
        for path, tail_name in blocks:
            mod = layer.get_submodule(path)
            tail = mod.get_submodule(tail_name) if tail_name else None
            for sub in mod.modules():
                if sub is not tail and self.row_wise(sub) and not (tail is not None and _within(sub, tail)):
                    return f"row-wise sharded weight inside the fused site at {path}"
        return None

    def wrap(self, layer: nn.Module, site, runtime):
        from ..patching.sites import ProjSite

        if (self.group is not None and isinstance(site, ProjSite) and site.tail is None
                and self.row_wise(layer.get_submodule(site.proj))):
            return Reduced(runtime, self.group, self.rank)
        return runtime

    def agree(self, plans: list, sites: list) -> list:
        """The prepared ``plans`` (layer, site, runtime, SiteReport) whose site was prepared on every
        rank; the others get a reason and stay original everywhere. Collective: every rank calls it
        with the same ``sites`` (the report's, in order)."""
        if self.group is None:
            return plans
        import torch.distributed as dist

        prepared = {id(p[3]) for p in plans}
        flags = torch.tensor([int(id(sr) in prepared) for sr in sites], dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self.group)
        everywhere = {id(sr) for sr, f in zip(sites, flags.tolist()) if f}
        for *_, sr in plans:
            if id(sr) not in everywhere:
                sr.reason = "prepared on this rank but not on every rank: left original on all of them"
        return [p for p in plans if id(p[3]) in everywhere]

    def note(self) -> str:
        if self.simulated:
            return (f"tensor parallel simulated: one rank's shapes of {self.world}, kernels cached for the "
                    f"sharded model")
        return (f"tensor parallel: rank {self.rank} of {self.world}; kernels searched for this rank's "
                f"weight shards, all-reduce (torch.distributed) after the row-wise o_proj / down_proj "
                f"kernels; where the residual add is fused, rank 0's kernel adds it before the all-reduce "
                f"(the other ranks add zero); the next norm is fused into the following projections' kernels")


def _within(sub: nn.Module, root: nn.Module) -> bool:
    return any(m is sub for m in root.modules())


def sharding_of(model: nn.Module) -> Sharding | None:
    """The model's ``Sharding`` if HF's tensor parallelism sharded it over more than one rank, else None."""
    params = sharded_params(model)
    if not params:
        world = _SIMULATED.get()
        return None if world is None else Sharding(world, 0, None, model.config, simulated=True)
    mesh = params[0][1].device_mesh
    world = mesh.size()
    if world <= 1:
        return None
    group = mesh.get_group()
    import torch.distributed as dist

    return Sharding(world, dist.get_rank(group), group, local_config(model.config, world),
                    device=params[0][1].to_local().device)
