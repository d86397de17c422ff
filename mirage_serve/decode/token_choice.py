"""Choose the next token on the device exactly as HF's ``_sample`` does, with no host sync.

HF applies its prepared ``LogitsProcessorList`` to float32 logits and then takes ``argmax`` (greedy)
or ``torch.multinomial(softmax(scores), 1)`` (sampling). This module reproduces the subset of that
list the fast decode loop supports, as plain tensor ops a CUDA graph can capture:

* ``MinLengthLogitsProcessor`` / ``MinNewTokensLengthLogitsProcessor`` decide on the host from
  ``input_ids.shape[-1]``; here the same condition is read from device counters (tokens generated so
  far vs. a per-call threshold), with HF's own op: ``torch.where(eos_mask, -inf, scores)``;
* the warpers (temperature, top-k, top-p) never read ``input_ids``: HF's own objects are called;
* ``torch.multinomial(p, 1)`` is, in PyTorch's own implementation for one sample,
  ``argmax(p / q)`` with ``q = empty_like(p).exponential_(1)``; we write those two ops out because
  older PyTorch validates ``p`` with a host sync inside ``multinomial`` (illegal in capture). The
  random stream consumed is the same, so a fixed seed gives HF's tokens.
"""
from __future__ import annotations

import math

import torch
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# Processors that only read the scores (not input_ids): safe to call inside a captured graph.
WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
MIN_LENGTH = (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)


def plan_processors(processors, prompt_width: int) -> tuple[tuple, int, str | None]:
    """Split HF's prepared processor list into (warpers, min tokens before EOS, why unsupported).

    The min-length threshold is counted in generated tokens: HF suppresses EOS while
    ``width + t < min_length`` (MinLength) or ``t < min_new_tokens`` (MinNewTokens, which skips the
    prompt width), ``t`` being the number of tokens generated before this step.
    """
    warpers, min_new, seen_warper = [], 0, False
    for p in processors:
        if isinstance(p, MIN_LENGTH):
            if seen_warper:  # HF puts them first; a custom order would change the distribution
                return (), 0, f"{type(p).__name__} after a warper"
            if isinstance(p, MinLengthLogitsProcessor):
                min_new = max(min_new, int(p.min_length) - prompt_width)
            else:
                min_new = max(min_new, int(p.prompt_length_to_skip) + int(p.min_new_tokens) - prompt_width)
        elif type(p) in WARPERS:
            warpers.append(p)
            seen_warper = True
        else:
            return (), 0, f"logits processor {type(p).__name__}"
    return tuple(warpers), max(min_new, 0), None


def warper_key(warpers) -> tuple:
    """What a captured graph bakes in from the warpers (their Python scalars)."""
    return tuple((type(w).__name__, tuple(sorted((k, v) for k, v in vars(w).items()
                                                 if isinstance(v, (int, float, bool)))))
                 for w in warpers)


class TokenChooser:
    """Next token from float32 logits: EOS suppression by device counter, warpers, argmax/sample."""

    def __init__(self, warpers: tuple, do_sample: bool):
        self.warpers = warpers
        self.do_sample = do_sample
        self.key = (do_sample, warper_key(warpers))
        self.plain_greedy = not do_sample and not warpers  # the argmax of the raw logits (greedy_kernels)

    def __call__(self, logits: torch.Tensor, generated: torch.Tensor, min_new: torch.Tensor,
                 eos_mask: torch.Tensor) -> torch.Tensor:
        # logits: [B, V] float32; generated, min_new: 0-d long; eos_mask: [V] bool -> tokens [B]
        scores = torch.where(eos_mask & (generated < min_new), -math.inf, logits)
        for w in self.warpers:
            scores = w(None, scores)
        if not self.do_sample:
            return torch.argmax(scores, dim=-1)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        q = torch.empty_like(probs).exponential_(1)
        return torch.argmax(probs / q, dim=-1)
