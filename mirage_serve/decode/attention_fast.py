"""Decode attention on a static KV cache through our kernels, per attention module instance.

``install_fast_attention(layers, config, records)`` sets an instance ``forward`` on each decoder
layer's attention module. A call that is one decode step (one new token per row) on an
initialised ``StaticLayer`` of an HF cache (or a sliding-window layer whose window is not full yet:
it is then written and masked as a static one, ``window_layers``) runs: the q/k/v projections (the patched fused
kernels), then the decode-attention kernels of the step's shape (``attention_searched``: the searched μGraph
of the attention program, or the hand-written ``attention_launch.decode_attention`` where the GPU profile
times it faster; per-head q/k RMSNorm, RoPE, cache write, attention), then ``o_proj``. Per-head norms
the kernels do not apply (Gemma 3's ``1 + weight`` in the searched program) run as the module's own, before them.
Every other call — prefill, dynamic caches, a full sliding window, training, ``torch.compile``
tracing, a mask we cannot read — runs the module's original forward.

Neither kernel is extracted from the model's code (both assume RoPE in HF's rotate-half form and softmax attention
with the module's ``scaling``), so neither is trusted blindly: the first
eligible call of each module runs both paths on the same step and compares the attention output,
the written cache slot and the cache's length (``patching.prepare.tolerance`` of the dtype). A module that
disagrees (or whose fast path raises) keeps its original forward for good; ``attention_verdicts(model)`` lists every
module's verdict. The check needs a host sync, so it never runs during CUDA-graph capture: the decode runner
always runs a step eagerly before it captures one.
"""
from __future__ import annotations

import logging

import torch

from superopt.runtime.interpreter import interpreting

from ..hf_names import cache_of
from ..patching.prepare import tolerance
from ..patching.install import Record, set_forward
from . import window_layers
from .attention_launch import decode_attention
from .attention_searched import AttentionSearch, Decision, SearchedGraph, Shape, time_both, unsearchable

log = logging.getLogger("mirage_serve")


def unsupported(module: torch.nn.Module, config) -> str | None:
    """Why ``module`` (an HF attention module) cannot take the fast path, or None."""
    has_qkv = all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj")) or hasattr(module, "qkv_proj")
    if not (has_qkv and hasattr(module, "o_proj")):
        return "no q/k/v (or qkv) and o projections"
    for attr in ("head_dim", "scaling", "layer_idx"):
        if getattr(module, attr, None) is None:
            return f"attention module has no {attr}"
    hq, hkv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    hkv = hkv or hq
    if _norm_span(module, hq, hkv) is None:
        return "q_norm / k_norm over neither one head nor the whole projection"
    if not hq or hq % hkv:
        return f"{hq} query heads are not a multiple of {hkv} kv heads"
    if module.head_dim % 2 or module.head_dim > 256:
        return f"head dim {module.head_dim} (even and at most 256 supported)"
    return None


def _norm_span(module, hq, hkv) -> str | None:
    """What the module's q_norm and k_norm normalise: "none" (it has none), "head" (each head, Qwen3 and
    Gemma-3: the kernel may apply them, ``fused_qk_norm``), "projection" (all heads at once, OLMo-2: the
    module's own norms run on the projections before the kernels); None for anything else."""
    sizes = [getattr(getattr(module, n, None), "weight", None) for n in ("q_norm", "k_norm")]
    if all(w is None for w in sizes):
        return "none"
    if not all(isinstance(w, torch.Tensor) for w in sizes) or not hq:
        return None
    d = module.head_dim
    if sizes[0].numel() == sizes[1].numel() == d:
        return "head"
    if (sizes[0].numel(), sizes[1].numel()) == (hq * d, hkv * d):
        return "projection"
    return None


# The per-head norms the kernel applies itself (attention_kernels._head): 1, HF's usual RMSNorm,
# ``weight * (x * rsqrt(mean(x²) + eps)).to(dtype)``; 2, Gemma-3's, ``(x * rsqrt(…) * (1 + weight)).to(dtype)``,
# both with float32 statistics.
_NORM_FORMS = {
    1: lambda xf, rs, w: w * (xf * rs).to(w.dtype),
    2: lambda xf, rs, w: (xf * rs * (1.0 + w.float())).to(w.dtype),
}


def _rms_form(norm: torch.nn.Module, d: int) -> tuple[float, int] | None:
    """(eps, form) if ``norm`` computes one of the RMSNorms of ``_NORM_FORMS`` over its last dim,
    else None. Judged on a probe input, since the module's class says little (Gemma-3's per-head
    norm has a Llama norm's attributes and scales by 1 + weight)."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(w, torch.Tensor) or tuple(w.shape) != (d,) or not isinstance(eps, float):
        return None
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, d, generator=g).to(w.device, w.dtype)
    with torch.no_grad():
        got = norm(x)
        xf = x.float()
        rs = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        wants = {form: f(xf, rs, w) for form, f in _NORM_FORMS.items()}
    tol = tolerance(w.dtype, w.is_cuda) or 1e-2
    for form, want in wants.items():
        if got.shape == want.shape and got.dtype == want.dtype:
            err = float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
            if err <= tol:
                return eps, form
    return None


def fused_qk_norm(module) -> tuple | None:
    """(q weight, k weight, eps, form) when the decode kernel can apply ``module``'s q_norm and k_norm
    itself (both one RMSNorm form of ``_NORM_FORMS`` over the head dim, one eps), else None."""
    qn, kn = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
    if qn is None or kn is None:
        return None
    proj = getattr(module, "q_proj", None) or getattr(module, "qkv_proj", None)
    dtype = getattr(getattr(proj, "weight", None), "dtype", None)
    if any(getattr(getattr(n, "weight", None), "dtype", None) != dtype for n in (qn, kn)):
        return None  # e.g. float32 norm weights in a bf16 model: HF's output is then float32, the kernel's bf16
    found = {_rms_form(n, module.head_dim) for n in (qn, kn)}
    if len(found) != 1 or None in found:
        return None
    eps, form = found.pop()
    return qn.weight, kn.weight, eps, form


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, n] with unit stride along each row (``attention_launch``'s layout): as it is, or a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


class FastAttention:
    """The fast path of one attention module and its first-use verdict."""

    def __init__(self, module, config, original, pdl: bool = True, search: AttentionSearch | None = None):
        self.module = module
        self.search = search  # the searched attention of this patch (None: the hand-written kernels only)
        self.searched_refused: str | None = None  # why this module's check refused the searched μGraph
        self.kernel: Decision | None = None  # what the last step ran, and why
        self.pdl = pdl  # launched with programmatic dependent launch where the GPU has it
        self.original = original
        self.hq = config.num_attention_heads
        self.hkv = getattr(config, "num_key_value_heads", None) or self.hq
        self.qk_norm = fused_qk_norm(module)  # None: the module's own norms run (if it has any)
        self.whole_norms = _norm_span(module, self.hq, self.hkv) == "projection"  # OLMo-2's
        self.softcap = getattr(config, "attn_logit_softcapping", None)  # Gemma-2's, else None
        self.verdict: str | None = None  # None: not checked yet; "ok" or why not
        self.cpu_ok = interpreting()  # Triton's CPU interpreter runs the kernels on CPU tensors (tests)

    # -------------------------------------------------------------- eligibility
    def _step_inputs(self, args, kwargs):
        """(x, cos, sin, cache layer, mask, pos, advance) of a decode step we can run, or None."""
        x = kwargs.get("hidden_states", args[0] if args else None)
        if len(args) > 1 or not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[1] != 1:
            return None
        if kwargs.get("output_attentions") or self.module.training or torch.is_grad_enabled():
            return None
        if torch.compiler.is_compiling() or not (x.is_cuda or self.cpu_ok):
            return None
        cache = cache_of(kwargs)
        layers = getattr(cache, "layers", None)
        idx = self.module.layer_idx
        if layers is None or idx >= len(layers):
            return None
        layer = layers[idx]
        if not window_layers.layer_replayable(layer) or not getattr(layer, "is_initialized", False):
            return None
        keys, values = layer.keys, layer.values
        b, d = x.shape[0], self.module.head_dim
        if keys.shape[0] != b or keys.shape[1] != self.hkv or keys.shape[3] != d or keys.dtype != x.dtype:
            return None
        # cos, sin over the rotary dims (all of d, or fewer: partial), in x's dtype or in float32 (OLMo-2's
        # rotary embedding keeps them wide, and its RoPE then computes in float32: the kernel does too)
        pe = kwargs.get("position_embeddings")
        if not (isinstance(pe, tuple) and len(pe) == 2 and pe[0].dtype in (x.dtype, torch.float32)
                and 0 < pe[0].shape[-1] <= d and pe[0].shape[-1] % 2 == 0 and pe[1].shape == pe[0].shape):
            return None
        cos, sin = (t.reshape(t.shape[0], t.shape[-1]) for t in pe)
        if cos.shape[0] not in (1, b) or cos.stride(-1) != 1 or sin.stride() != cos.stride():
            return None
        mask = kwargs.get("attention_mask")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.ndim != 4 or mask.shape[1:3] != (1, 1) \
                    or mask.shape[0] not in (1, b) or mask.shape[3] != keys.shape[2]:
                return None
            # a sliding layer's mask bounds the query by a host length a captured step would freeze
            mask = window_layers.lift_causal_bound(mask, layer) if window_layers.sliding(layer) else mask[:, 0, 0, :]
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor) and counter.numel() == 1 and counter.device == x.device:
            pos, advance = counter, counter
        else:  # transformers releases that index the cache by cache_position
            pos, advance = kwargs.get("cache_position"), None
            if not isinstance(pos, torch.Tensor) or pos.numel() != 1:
                return None
        return x, cos, sin, layer, mask, pos, advance

    # -------------------------------------------------------------- the step
    def _projections(self, x):
        """q, k, v [b, heads·d] as the module computes them before its per-head norms."""
        m, d = self.module, self.module.head_dim
        if hasattr(m, "qkv_proj"):
            qkv = m.qkv_proj(x)
            q, k, v = qkv.split((self.hq * d, self.hkv * d, self.hkv * d), dim=-1)
        else:
            q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)
        if self.whole_norms:  # over all heads at once, as HF's forward runs them, before the head split
            q, k = m.q_norm(q), m.k_norm(k)
        return q, k, v

    def _rows(self, q, k, v, kernel_norms: bool):
        """The kernels' q, k, v: [b, heads·d], unit stride along rows, the module's per-head norms applied
        unless the kernels apply them (``kernel_norms``)."""
        m, b, d = self.module, q.shape[0], self.module.head_dim
        if not kernel_norms and not self.whole_norms and getattr(m, "q_norm", None) is not None:
            q, k = m.q_norm(q.view(b, 1, self.hq, d)), m.k_norm(k.view(b, 1, self.hkv, d))
        # the kernels read each row with unit stride; a projection site may hand back another layout
        # (OLMo-2's projections alone at 2+ rows: [b, N] with strides (1, b)), which is copied then
        return [_unit_rows(t.reshape(b, -1)) for t in (q, k, v)]

    def _searched(self, step, graph: SearchedGraph, raw):
        """``fn(keys, values, pos, advance=None) -> attention output [b, Hq·d]``: the searched μGraph on this
        step's projections ``raw``."""
        cos, sin, mask = step[1], step[2], step[4]
        norms = graph.shape.qk_norm_eps is not None
        q, k, v = self._rows(*raw, kernel_norms=norms)
        weights = self.qk_norm[:2] if norms else None

        def searched(keys, values, pos, advance=None):  # the graph advances the cache's length, as the reference does
            return graph(q, k, v, cos, sin, keys, values, pos, mask, weights, advance)
        return searched

    def _handwritten(self, step, raw):
        """The same for the hand-written reference kernels (``attention_launch``)."""
        cos, sin, mask = step[1], step[2], step[4]
        q, k, v = self._rows(*raw, kernel_norms=self.qk_norm is not None)

        def handwritten(keys, values, pos, advance=None):
            return decode_attention(q, k, v, cos, sin, keys, values, pos, mask, self.module.scaling, advance,
                                    qk_norm=self.qk_norm, pdl=self.pdl, softcap=self.softcap,
                                    rotary_dim=cos.shape[-1])
        return handwritten

    def _shape(self, step) -> Shape | str:
        """The searched program's shape for this step, or why the step is not one it describes."""
        x, cos, _, layer, mask, _, _ = step
        d = self.module.head_dim
        why = unsearchable(x, cos, mask, d)
        if why is not None:
            return why
        eps = self.qk_norm[2] if self.qk_norm is not None and self.qk_norm[3] == 1 else None
        return Shape(x.shape[0], self.hq, self.hkv, d, layer.keys.shape[2], str(x.dtype).removeprefix("torch."),
                     float(self.module.scaling), self.softcap, eps)

    def _kernel(self, step) -> tuple[Decision, SearchedGraph | None]:
        """Which kernels this step runs (decided once per shape, ``AttentionSearch.decide``)."""
        if self.search is None:
            return Decision("hand-written", "decode attention search off"), None
        if self.searched_refused is not None:
            return Decision("hand-written", self.searched_refused), None
        shape = self._shape(step)
        if isinstance(shape, str):
            return Decision("hand-written", f"no searched program: {shape}"), None
        decision = self.search.decision(shape)
        if decision is None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                # never reached by the decode runner (it runs each new shape eagerly first)
                return Decision("hand-written", "a new shape met inside a CUDA-graph capture"), None
            decision = self.search.decide(shape, lambda: self.search.graph(shape, step[0].device),
                                          lambda graph: self._time(step, graph), step[0].device)
        graph = self.search.graph(shape, step[0].device) if decision.kernel == "searched" else None
        return decision, graph

    def _time(self, step, graph):
        """(searched µs, hand-written µs) on the GPU (``attention_searched.time_both``), or None."""
        x, layer = step[0], step[3]
        if not x.is_cuda or interpreting():
            return None
        raw = self._projections(x)
        return time_both(self._searched(step, graph, raw), self._handwritten(step, raw), layer.keys, layer.values)

    def fast(self, step, kernel=None) -> torch.Tensor:
        x, _, _, layer, _, pos, advance = step
        self.kernel, graph = kernel or self._kernel(step)
        raw = self._projections(x)
        run = self._searched(step, graph, raw) if graph is not None else self._handwritten(step, raw)
        out = run(layer.keys, layer.values, pos, advance)
        window_layers.advance_layer(layer, 1)  # what HF's update() counts on the host (sliding layers)
        return self.module.o_proj(out.view(x.shape[0], 1, -1))

    def __call__(self, *args, **kwargs):
        step = self._step_inputs(args, kwargs) if self.verdict in (None, "ok") else None
        if step is None:
            return self.original(*args, **kwargs)
        if self.verdict is None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return self.original(*args, **kwargs)
            return self._checked(step, args, kwargs)
        return self.fast(step), None

    def _checked(self, step, args, kwargs):
        """Run the original forward and the fast path on the same step; keep the original's
        effects (output, cache slot, length) and decide whether the fast path may run from now."""
        x, _, _, layer, _, pos, advance = step
        # A residual the layer handed to o_proj (patching.residual) is left for the layer to add on
        # this step: both forwards then return o_proj's output alone, compared as they are.
        handoff = getattr(getattr(self.module.o_proj, "forward", None), "residual_slot", None)
        if handoff is not None:
            handoff.take()
        slot = int(pos)
        host = getattr(layer, "cumulative_length_int", None)  # a sliding layer's host length
        before = (layer.keys[:, :, slot].clone(), layer.values[:, :, slot].clone(),
                  None if advance is None else advance.clone())
        ref = self.original(*args, **kwargs)
        after = (layer.keys[:, :, slot].clone(), layer.values[:, :, slot].clone(),
                 None if advance is None else advance.clone())
        host_after = getattr(layer, "cumulative_length_int", None)
        self._restore(layer, slot, before, advance, host)
        kernel = self._kernel(step)
        self.verdict = self._check_kernel(step, kernel, ref, slot, after, host_after)
        if self.verdict != "ok" and kernel[1] is not None:  # the searched μGraph disagreed: the reference may run
            self.searched_refused = f"the searched μGraph disagreed with the module's forward: {self.verdict}"
            self._restore(layer, slot, before, advance, host)
            self.verdict = self._check_kernel(step, self._kernel(step), ref, slot, after, host_after)
        if self.verdict != "ok":
            log.warning("mirage_serve: decode attention of layer %d keeps the original forward: %s",
                        self.module.layer_idx, self.verdict)
        # the original's results stand for this step, whatever the verdict (slot, counter, host length)
        self._restore(layer, slot, after, advance, host_after)
        return ref

    @staticmethod
    def _restore(layer, slot, state, advance, host) -> None:
        """The cache slot, length counter and host length set to ``state`` (before or after a step), ``host``."""
        layer.keys[:, :, slot], layer.values[:, :, slot] = state[0], state[1]
        if advance is not None:
            advance.copy_(state[2])
        if host is not None:
            layer.cumulative_length_int = host

    def _check_kernel(self, step, kernel, ref, slot: int, after, host_after) -> str:
        """Run ``kernel`` on the step and compare it with the original forward's effects: "ok" or why not."""
        layer, advance = step[3], step[6]
        try:
            got = self.fast(step, kernel)
            verdict = self._compare(ref[0], got, layer, slot, after, advance)
            if verdict == "ok" and getattr(layer, "cumulative_length_int", None) != host_after:
                verdict = "the cache's host length differs from the original forward"
        except Exception as e:  # a module the kernels cannot take after all: the original's results stand
            verdict = f"the fast path raised {type(e).__name__}: {e}".splitlines()[0]
        return verdict

    def _compare(self, ref, got, layer, slot, after, advance) -> str:
        tol = tolerance(ref.dtype, ref.is_cuda) or 1e-2
        checks = (("output", ref, got), ("cached key", after[0], layer.keys[:, :, slot]),
                  ("cached value", after[1], layer.values[:, :, slot]))
        for what, a, b in checks:
            a, b = a.double(), b.double()
            err = float((a - b).norm() / a.norm().clamp_min(1e-30))
            if not err <= tol:
                return f"{what} differs from the original forward (relative error {err:.2e} > {tol:.0e})"
        if advance is not None and not torch.equal(advance, after[2]):
            return "cache length counter differs from the original forward"
        return "ok"


def find_attention(layer: torch.nn.Module, config) -> str | None:
    """The name of ``layer``'s direct child the fast path can take (for every family: adapters name
    no attention module), or None. Its contract is HF's attention attributes (q/k/v or qkv and o projections,
    ``head_dim``, ``scaling``, ``layer_idx``); whether it computes what the kernels do is left to the
    first-use check against its own forward."""
    return next((name for name, child in layer.named_children() if unsupported(child, config) is None), None)


def install_fast_attention(layers, attn_name: str, config, records: list[Record],
                           pdl: bool = True, search: AttentionSearch | None = None) -> dict[int, FastAttention]:
    """Set the fast forward on every supported ``layers[i].<attn_name>``; returns them by layer.
    ``pdl``: launch with programmatic dependent launch where the GPU has it (``PatchOptions.pdl``).
    ``search``: the searched attention (``attention_searched``); None runs the hand-written kernels."""
    out = {}
    for i, layer in enumerate(layers):
        module = getattr(layer, attn_name, None)
        if module is None or unsupported(module, config) is not None:
            continue
        fast = FastAttention(module, config, module.forward, pdl, search)
        set_forward(module, fast, records)
        out[i] = fast
    return out


def attention_verdicts(model: torch.nn.Module) -> dict[str, str]:
    """Module path -> first-use verdict ("ok", "not checked yet", or why it kept the original)."""
    return {name: fast.verdict or "not checked yet" for name, m in model.named_modules()
            if isinstance(fast := m.__dict__.get("forward"), FastAttention)}


def attention_kernels(model: torch.nn.Module) -> dict[str, str]:
    """Module path -> which kernels its last decode step ran and why ("searched: μGraph ...",
    "hand-written: ..."), or "no decode step yet"."""
    return {name: f"{fast.kernel.kernel}: {fast.kernel.why}" if fast.kernel else "no decode step yet"
            for name, m in model.named_modules() if isinstance(fast := m.__dict__.get("forward"), FastAttention)}


def kernel_layers(model: torch.nn.Module) -> set[int]:
    """The layer indices whose attention runs the decode-attention kernels (first-use check passed)."""
    return {fast.module.layer_idx for m in model.modules()
            if isinstance(fast := m.__dict__.get("forward"), FastAttention) and fast.verdict == "ok"}
