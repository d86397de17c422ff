"""Timing for `bench`: decode-step time from generate(), copy bandwidth, and a stderr progress bar.

Decode-step time = (time for N new tokens − time for 1) ÷ (N − 1), with `min_new_tokens` fixing the
length, so prefill and per-call overheads cancel (docs/measuring.md). Each length is run once untimed
first: torch.compile (static-cache baseline) compiles per cache length, and that must not be timed.
"""
from __future__ import annotations

import statistics
import sys
import time


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, one line per step otherwise)."""

    def __init__(self, label: str, total: int, stream=None, width: int = 24):
        self.label, self.total, self.width = label, max(total, 1), width
        self.stream = stream or sys.stderr
        self.done = 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()

    def step(self, what: str = "") -> None:
        self.done = min(self.done + 1, self.total)
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        line = (f"{self.label} [{bar}] {self.done}/{self.total} {what} "
                f"({time.perf_counter() - self.t0:.1f}s)")
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def generate(model, ids, new_tokens: int, cache: str):
    """Greedy generate of exactly `new_tokens` tokens; returns only the new ids [B, new_tokens].

    ``cache``: "dynamic" / "default" (HF's choice), "static" (HF's static cache, auto-compiled),
    "static-eager" (the static cache with HF's auto-compile off)."""
    import torch

    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  attention_mask=torch.ones_like(ids), pad_token_id=0,
                  temperature=None, top_p=None, top_k=None)
    if cache in ("static", "static-eager"):
        kwargs["cache_implementation"] = "static"
    if cache == "static-eager":
        kwargs["disable_compile"] = True
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    return out[:, ids.shape[1]:]


def _timed(model, ids, n: int, cache: str, device: str) -> tuple[float, object]:
    synchronize(device)
    t0 = time.perf_counter()
    out = generate(model, ids, n, cache)
    synchronize(device)
    return time.perf_counter() - t0, out


def decode_step_time(model, ids, new_tokens: int, cache: str, device: str, repeats: int,
                     progress: Progress | None = None, every_run: list | None = None,
                     warmup: list | None = None, each_step: list | None = None):
    """(seconds per decode step, new token ids [B, new_tokens]) — median over `repeats`.

    Warm-up (and compile) at both lengths on GPU and for the static cache; CPU eager has nothing to
    warm, and skipping it halves the default CPU run. ``every_run``: a list that receives the new
    tokens of each timed run (the same prompt each time: whether the run repeats itself). ``warmup``:
    a list that receives the warm-up's seconds (what a first generate() at this batch costs: HF's
    compile, or a patched model's first-use checks, attention choice and graph captures). ``each_step``: a list
    that receives each repetition's own step time (its long run less its short run), whose spread says how far
    the median can be trusted.
    """
    if device.startswith("cuda") or cache.startswith("static"):
        t0 = time.perf_counter()
        _timed(model, ids, new_tokens, cache, device)
        _timed(model, ids, 1, cache, device)
        if warmup is not None:
            warmup.append(time.perf_counter() - t0)
        if progress:
            progress.step("warm-up")
    longs, shorts, tokens = [], [], None
    for _ in range(repeats):
        t_long, tokens = _timed(model, ids, new_tokens, cache, device)
        if every_run is not None:
            every_run.append(tokens)
        t_short, _ = _timed(model, ids, 1, cache, device)
        longs.append(t_long)
        shorts.append(t_short)
        if each_step is not None:
            each_step.append((t_long - t_short) / max(new_tokens - 1, 1))
        if progress:
            progress.step("timed")
    step = (statistics.median(longs) - statistics.median(shorts)) / max(new_tokens - 1, 1)
    if step <= 0:  # noise larger than the decode steps (a tiny model, few tokens): prefill included
        step = statistics.median(longs) / max(new_tokens, 1)
    return step, tokens


def first_divergence(ref, got) -> dict | None:
    """The first decode step where any row differs, as {"step", "row"}; None when identical.

    ref, got: [B, N] token ids of the same prompts.
    """
    diff = (ref != got)
    if not bool(diff.any()):
        return None
    steps = diff.any(dim=0).nonzero()
    step = int(steps[0])
    row = int(diff[:, step].nonzero()[0])
    return {"step": step, "row": row, "expected": int(ref[row, step]), "got": int(got[row, step])}
