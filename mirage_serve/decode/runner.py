"""Route a patched model's generate() through owned static caches and CUDA-graph decode steps.

``DecodeRunner.install(model)`` replaces two *instance* attributes (the class is untouched):

* ``generate``: unless the caller brings their own cache, it hands generate() a static cache from
  the model's ``CachePool`` (sized to prompt + new tokens) and turns off HF's auto-compile, which
  would otherwise compile around our graphs; a greedy/sampling call the graphed decode loop
  reproduces (``fast_generate``) runs it — one graph replay per token, token choice included —
  and every other call runs HF's loop. ``paths`` counts which loop ran and why HF's did;
* ``forward``: a call that is a decode step on one of those caches (one new token per row, no
  attention/hidden-state outputs requested) replays the ``GraphedStep`` captured for its signature
  (batch size, cache, argument shapes); every other call (prefill, training, foreign caches) runs
  the forward it replaced.

``uninstall`` deletes both attributes and drops the caches and graphs.
"""
from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch

from ..hf_names import CACHE_KWARG, cache_of
from .cache_pool import CachePool
from .fast_generate import call_blocker, fast_sample
from .fast_loop import DecodeLoop
from .graph_step import GraphedStep, signature
from .window_layers import replayable

_ATTR = "_mirage_decode_runner"


class DecodeRunner:
    def __init__(self, model, capture: bool | None = None, fast_loop: bool = True, config=None):
        self.model = model
        self.capture = torch.cuda.is_available() if capture is None else capture
        self.fast_loop = fast_loop  # False: every call runs HF's loop (graphed steps only)
        # config: the KV heads this process holds (a tensor-parallel rank's share; mirage_serve.tp)
        self.pool = CachePool(config if config is not None else model.config)
        self.steps: dict[tuple, GraphedStep] = {}
        self.graph_pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.captures = 0
        self.replays = 0
        self.loops: dict[tuple, DecodeLoop] = {}  # graphed decode loops, by signature
        # "fast" / "hf" -> calls; "hf: <reason>" -> calls that kept HF's loop for that reason
        self.paths: Counter = Counter()
        self._forward = None  # the forward we replaced (possibly already patched per site)

    # ------------------------------------------------------------ install / uninstall
    @classmethod
    def install(cls, model, capture: bool | None = None, fast_loop: bool = True, config=None) -> "DecodeRunner":
        if getattr(model, _ATTR, None) is not None:
            raise RuntimeError("decode graphs are already installed on this model; uninstall first")
        runner = cls(model, capture, fast_loop, config)
        runner._forward = model.forward
        runner._generate = model.generate
        # generate() inspects forward's signature to decide whether to prepare position ids,
        # the attention mask and logits_to_keep: the wrapper must show the original signature.
        model.forward = functools.wraps(runner._forward)(functools.partial(DecodeRunner.forward, runner))
        model.generate = functools.wraps(runner._generate)(functools.partial(DecodeRunner.generate, runner))
        setattr(model, _ATTR, runner)
        return runner

    @staticmethod
    def uninstall(model) -> None:
        runner = getattr(model, _ATTR, None)
        if runner is None:
            return
        for name in ("forward", "generate", _ATTR):
            if name in model.__dict__:
                delattr(model, name)
        runner.steps.clear()
        runner.loops.clear()
        runner.pool.clear()

    # ------------------------------------------------------------ generate
    def generate(self, *args, **kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        needed = self._needed_length(input_ids, kwargs)
        beams = kwargs.get("num_beams") or self.model.generation_config.num_beams or 1
        own_cache = cache_of(kwargs) is not None
        if own_cache or needed is None or self.model.training or beams != 1:
            self.count_path("hf", "own cache" if own_cache
                            else "unknown length" if needed is None
                            else "training" if self.model.training else "beams")
            return self._generate(*args, **kwargs)
        cache, fresh = self.pool.get(int(input_ids.shape[0]), needed)
        if fresh:  # graphs captured on a replaced cache point at freed memory: drop them
            self.steps = {k: s for k, s in self.steps.items()
                          if self.pool.owns(cache_of(s.static_in))}
            self.loops = {k: lp for k, lp in self.loops.items() if self.pool.owns(lp.cache)}
        kwargs[CACHE_KWARG] = cache
        kwargs.setdefault("disable_compile", True)
        reason = call_blocker(self.model, args, kwargs) if self.fast_loop else "fast loop off"
        if reason is None:  # HF prepares everything, then runs our loop instead of _sample
            kwargs["custom_generate"] = functools.partial(fast_sample, self)
        else:
            self.count_path("hf", reason)
        return self._generate(*args, **kwargs)

    def count_path(self, path: str, reason: str | None = None) -> None:
        self.paths[path] += 1
        if reason is not None:
            self.paths[f"{path}: {reason}"] += 1

    def loop_for(self, cache, batch: int, chooser, extra: dict) -> DecodeLoop:
        """The decode loop of this signature, made on first use (its graph is captured lazily)."""
        key = (batch, id(cache), chooser.key, tuple(sorted(extra.items())))
        loop = self.loops.get(key)
        if loop is None:
            length = self.pool.length(cache)  # the generation's length: sliding layers hold less
            loop = DecodeLoop(self.model, self._forward, cache, batch, length, chooser, extra,
                              self.graph_pool, self.capture)
            self.loops[key] = loop
        return loop

    def _needed_length(self, input_ids, kwargs) -> int | None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
            return None
        gc = kwargs.get("generation_config") or self.model.generation_config
        new = kwargs.get("max_new_tokens", gc.max_new_tokens)
        if new is not None:
            return int(input_ids.shape[1]) + int(new)
        total = kwargs.get("max_length", gc.max_length)
        return int(total) if total is not None else None

    # ------------------------------------------------------------ forward
    def _is_decode_step(self, kwargs: dict) -> bool:
        ids = kwargs.get("input_ids")
        return (isinstance(ids, torch.Tensor) and ids.ndim == 2 and ids.shape[1] == 1
                and self.pool.owns(cache_of(kwargs)) and replayable(cache_of(kwargs).layers)
                and not kwargs.get("output_attentions") and not kwargs.get("output_hidden_states")
                and kwargs.get("inputs_embeds") is None and not self.model.training
                and not torch.is_grad_enabled())

    def forward(self, *args, **kwargs) -> Any:
        if args or not self._is_decode_step(kwargs):
            return self._forward(*args, **kwargs)
        key = signature(kwargs)
        step = self.steps.get(key)
        if step is None and not replayable(cache_of(kwargs).layers, 2):  # the captured step must not fill a window
            return self._forward(*args, **kwargs)
        if step is None:
            step = GraphedStep(self._forward, kwargs, self.graph_pool, capture=self.capture)
            self.steps[key] = step
            self.captures += 1
            return step.first_output
        self.replays += 1
        return step(kwargs)


def install_decode_graphs(model, capture: bool | None = None, fast_loop: bool = True, config=None) -> DecodeRunner:
    return DecodeRunner.install(model, capture, fast_loop, config)


def uninstall_decode_graphs(model) -> None:
    DecodeRunner.uninstall(model)


def decode_paths(model) -> dict[str, int]:
    """Which decode loop generate() ran on this model: {"fast": n, "hf": n, "hf: <reason>": n}."""
    runner = getattr(model, _ATTR, None)
    return dict(runner.paths) if runner is not None else {}
