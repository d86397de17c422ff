"""Every environment variable mirage_serve reads, declared once, read nowhere else.

Each knob is a `Knob` in the module-level table `KNOBS`; code reads one with its typed accessor
(`CACHE_DIR.get()`), never with ``os.environ``. To add a variable, declare a `Knob` below with its
parser and a one-line doc; `describe()` lists them all (the CLI prints it, docs quote it).

Values are read at call time, not import time. The switches that change what ``patch()`` does
(``PDL``, ``PAIRED_LAUNCH``, ``STACKED_PROJECTIONS``, ``FINAL_NORM``, ``LM_HEAD``, ``RESEARCH``, ``RETIME_LAUNCHES``,
``DETERMINISTIC``, ``FUSED_RESIDUAL``, ``ATTENTION``) are only the defaults of ``mirage_serve.PatchOptions``' fields, read when the options
are made; code and tests pass options, never set these variables.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}, got {s!r}")


def parse_path(s: str) -> Path:
    return Path(s).expanduser()


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: its name, parser, value when unset, and what it does."""

    name: str
    parse: Callable[[str], T]
    default: T
    doc: str

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def is_set(self) -> bool:
        # An empty string counts as unset: `FOO= cmd` is how shells clear a variable for one command.
        return bool(self.raw())

    def get(self) -> T:
        raw = self.raw()
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"environment variable {self.name}={raw!r} is invalid: {e}") from None


CACHE_DIR: Knob[Path | None] = Knob(
    "MIRAGE_SERVE_CACHE_DIR", parse_path, None,
    "user kernel cache directory (default ~/.cache/mirage_serve); an argument overrides it")

CACHE_READ_ONLY: Knob[bool] = Knob(
    "MIRAGE_SERVE_CACHE_READ_ONLY", parse_bool, False,
    "treat the user cache as read-only: misses are compiled in memory and reported, never written")

CACHE_KEY: Knob[Path | None] = Knob(
    "MIRAGE_SERVE_CACHE_KEY", parse_path, None,
    "file of the per-user secret that signs kernel cache entries (default ~/.config/mirage_serve/cache-key; "
    "created on first use, mode 0600)")

PDL: Knob[bool] = Knob(
    "MIRAGE_SERVE_PDL", parse_bool, True,
    "launch the generated kernels with programmatic dependent launch on sm_90+ (default of PatchOptions.pdl)")

PAIRED_LAUNCH: Knob[bool] = Knob(
    "MIRAGE_SERVE_PAIRED_LAUNCH", parse_bool, True,
    "run k_proj and v_proj as one launch where patch() times it faster (decision and kernels kept in the "
    "kernel cache); 0 keeps two launches (default of PatchOptions.paired_launch)")

STACKED_PROJECTIONS: Knob[bool] = Knob(
    "MIRAGE_SERVE_STACKED_PROJECTIONS", parse_bool, True,
    "run a layer's q, k and v projections as one, on their weights stacked into one matrix that the originals "
    "then view (no copy kept); 0 searches and launches them apart (default of PatchOptions.stacked_projections)")

FINAL_NORM: Knob[bool] = Knob(
    "MIRAGE_SERVE_FINAL_NORM", parse_bool, True,
    "run the model's final norm (after the last decoder layer) as a site kernel, one launch instead of the norm's "
    "own torch ops; 0 leaves it original (default of PatchOptions.final_norm)")

LM_HEAD_CHOICES = ("cached", "search", "off")


def parse_lm_head(s: str) -> str:
    """'cached', 'search' or 'off'; a boolean's spellings mean 'search' (1, on...) and 'off' (0, off...), as the
    switch was a boolean before 'cached' became its default."""
    v = s.strip().lower()
    if v in LM_HEAD_CHOICES:
        return v
    try:
        return "search" if parse_bool(v) else "off"
    except ValueError:
        raise ValueError(f"expected one of {list(LM_HEAD_CHOICES)} (or 1 / 0), got {s!r}") from None


LM_HEAD: Knob[str] = Knob(
    "MIRAGE_SERVE_LM_HEAD", parse_lm_head, "cached",
    "the model's output projection (lm_head) as a searched site kernel, launched with dependent launch like the "
    "layers' kernels, instead of cuBLAS's GEMV (H200: 0.5-4% faster steps at b1, the same at b8): 'cached' runs it "
    "at the batch buckets a kernel cache entry (shipped or the user's) holds, and never searches for it; 'search' "
    "(or 1) searches the buckets no entry holds, about a minute a bucket for Llama-3.1-8B's, and is what "
    "`mirage-serve warm` does when this is unset; 'off' (or 0) keeps cuBLAS (default of PatchOptions.lm_head)")

RESEARCH: Knob[bool] = Knob(
    "MIRAGE_SERVE_RESEARCH", parse_bool, False,
    "search again, where patch() profiles on the GPU, the programs the shipped kernel cache has: the shipped "
    "μGraph competes with the new candidates, stays unless one is at least 5% faster, and the winner goes to the user "
    "cache (for refreshing kernels_cache/; default of PatchOptions.research)")

DETERMINISTIC: Knob[bool] = Knob(
    "MIRAGE_SERVE_DETERMINISTIC", parse_bool, True,
    "generated kernels that sum partial results across thread blocks (split-K projections) add them in a fixed "
    "order, so a decode step gives the same bits on every run; 0: float atomic adds, whose order varies from run to "
    "run, 0.7% (Llama-3.2-1B) and 4% (Qwen2.5-0.5B) faster a step at 8 rows on an H200 (default of "
    "PatchOptions.deterministic)")

RETIME_LAUNCHES: Knob[bool] = Knob(
    "MIRAGE_SERVE_RETIME_LAUNCHES", parse_bool, False,
    "time again, on this GPU, the launches of a shipped or imported entry whose launch another GPU model timed (its "
    "μGraph kept; seconds an entry, once: the result goes to the user cache); without it such an entry runs its row "
    "for this GPU if it has one, else its default launch (default of PatchOptions.retime_launches)")

FUSED_RESIDUAL: Knob[bool] = Knob(
    "MIRAGE_SERVE_FUSED_RESIDUAL", parse_bool, True,
    "add the decoder layer's residual inside the kernels of the projections whose outputs it adds (found from the "
    "traced layer); 0 leaves the adds to the layer (default of PatchOptions.fused_residual)")

ATTENTION_CHOICES = ("profiled", "searched", "hand-written")


def parse_attention(s: str) -> str:
    v = s.strip().lower()
    if v not in ATTENTION_CHOICES:
        raise ValueError(f"expected one of {list(ATTENTION_CHOICES)}, got {s!r}")
    return v


ATTENTION: Knob[str] = Knob(
    "MIRAGE_SERVE_ATTENTION", parse_attention, "profiled",
    "which decode-attention kernels run: 'profiled' (the searched μGraph, or the hand-written reference kernels "
    "where the GPU profile times them faster), 'searched' or 'hand-written' (to compare them; default of "
    "PatchOptions.attention)")

PROGRESS: Knob[bool] = Knob(
    "MIRAGE_SERVE_PROGRESS", parse_bool, True,
    "print a line on stderr when patch() or a first decode step starts something slow (a search, the GPU "
    "profile of its candidates, the choice of a decode-attention shape) and when it ends; 0 silences them")

KNOBS: tuple[Knob, ...] = (CACHE_DIR, CACHE_READ_ONLY, CACHE_KEY, PDL, PAIRED_LAUNCH, STACKED_PROJECTIONS, FINAL_NORM,
                           LM_HEAD, RESEARCH, RETIME_LAUNCHES, DETERMINISTIC, FUSED_RESIDUAL, ATTENTION,
                           PROGRESS)


def torchrun_ranks() -> tuple[int, int, int] | None:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as torchrun sets them in each process it starts, or None when this
    process was not started by torchrun. Not knobs (torchrun owns them), but read here, as every
    environment variable is."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))


def describe() -> str:
    """One line per knob: name, current value (or 'unset'), doc."""
    lines = []
    for k in KNOBS:
        now = k.raw() if k.is_set() else "unset"
        lines.append(f"{k.name} = {now}  # {k.doc}")
    return "\n".join(lines)
