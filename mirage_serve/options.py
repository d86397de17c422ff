"""PatchOptions: the switches that change what ``patch()`` does, passed as one frozen argument.

    mirage_serve.patch(model)                                          # defaults (below)
    mirage_serve.patch(model, options=PatchOptions(pdl=False))         # one switch changed

A field left out takes its default from the environment, read once, when the options are made, and
only through ``mirage_serve.knobs`` (the one place environment variables are read; a deployment
sets ``MIRAGE_SERVE_PDL=0`` without touching code). Code and tests pass the fields they mean; the
environment is never consulted again after construction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import knobs

__all__ = ["PatchOptions"]


@dataclass(frozen=True)
class PatchOptions:
    """What ``patch(model, options=...)`` does beyond its arguments; each field's default is its knob's."""

    # kernels launched with programmatic dependent launch on sm_90+ (superopt.runtime.grid_dependency)
    pdl: bool = field(default_factory=knobs.PDL.get)
    # k_proj and v_proj as one launch where it times faster (mirage_serve.patching.pairing)
    paired_launch: bool = field(default_factory=knobs.PAIRED_LAUNCH.get)
    # a norm site's plain Linear consumers (q, k, v) as one projection on their stacked weights
    # (mirage_serve.patching.stacking)
    stacked_projections: bool = field(default_factory=knobs.STACKED_PROJECTIONS.get)
    # the model's final norm as a site kernel of its own (mirage_serve.patching.final_norm)
    final_norm: bool = field(default_factory=knobs.FINAL_NORM.get)
    # the model's output projection as a site kernel of its own (mirage_serve.patching.lm_head): "cached" (at the
    # buckets a cache entry holds, never searched), "search" (searched where no entry holds it) or "off"
    lm_head: str = field(default_factory=knobs.LM_HEAD.get)
    # the layer's residual adds inside the kernels of the projections they add (mirage_serve.patching.residual)
    fused_residual: bool = field(default_factory=knobs.FUSED_RESIDUAL.get)
    # search again the programs the shipped cache holds, on the GPU profile (mirage_serve.optimize.choose)
    research: bool = field(default_factory=knobs.RESEARCH.get)
    # time again on this GPU the launches of a shipped entry timed on another GPU model (mirage_serve.cache.gpu_rows)
    retime_launches: bool = field(default_factory=knobs.RETIME_LAUNCHES.get)
    # cross-block sums of the generated kernels in a fixed order: the same bits on every run (superopt.codegen.launch)
    deterministic: bool = field(default_factory=knobs.DETERMINISTIC.get)
    # decode attention: "profiled" (the searched μGraph, or the hand-written reference where the GPU profile
    # times it faster), "searched" or "hand-written" (mirage_serve.decode.attention_searched)
    attention: str = field(default_factory=knobs.ATTENTION.get)

    def __post_init__(self):
        for name in ("pdl", "paired_launch", "stacked_projections", "final_norm", "fused_residual", "research",
                     "retime_launches", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"PatchOptions.{name} must be a bool, got {getattr(self, name)!r}")
        if self.lm_head not in knobs.LM_HEAD_CHOICES:
            raise ValueError(f"PatchOptions.lm_head must be one of {list(knobs.LM_HEAD_CHOICES)}, got {self.lm_head!r}")
        if self.attention not in knobs.ATTENTION_CHOICES:
            raise ValueError(f"PatchOptions.attention must be one of {list(knobs.ATTENTION_CHOICES)}, "
                             f"got {self.attention!r}")
