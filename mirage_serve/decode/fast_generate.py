"""Decide whether a generate() call can run the graphed decode loop, and run it (else HF's loop).

HF's ``generate`` accepts a ``custom_generate`` callable: it still does all of its preparation
(merging the GenerationConfig, special tokens, attention mask and position ids, the static cache,
the logits processors and stopping criteria) and then calls ours instead of ``_sample``. So the
fast path decides from exactly what HF prepared, and falls back by calling ``_sample`` itself with
the same arguments — the call HF would have made.

Two checks: ``call_blocker`` (before generate(), on the call's arguments and merged config: only a
greedy/sampling call with plain-tensor output is handed our callable) and ``loop_blocker`` (inside,
on the prepared processors, criteria, model kwargs and cache). Each returns a short reason or None;
the runner counts the reasons so a report can say which path ran and why.
"""
from __future__ import annotations

import torch
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from ..hf_names import CACHE_KWARG
from . import window_layers
from .token_choice import TokenChooser, plan_processors

# generate()'s own parameters that change the loop: any of them set keeps HF's loop.
_LOOP_ARGS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "synced_gpus",
              "assistant_model", "streamer", "negative_prompt_ids", "negative_prompt_attention_mask",
              "custom_generate")
# Model kwargs (what the merged GenerationConfig does not consume) the loop understands.
_CALL_MODEL_KWARGS = {"attention_mask", CACHE_KWARG, "disable_compile"}
_LOOP_MODEL_KWARGS = {"attention_mask", "position_ids", CACHE_KWARG, "use_cache", "logits_to_keep"}
_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
_OUTPUT_FLAGS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


def _synced_gpus(model) -> bool:
    """Whether HF's generate() would sync the ranks' loops by itself (ZeRO-3 or FSDP), as it decides."""
    try:
        from transformers.distributed.fsdp import is_fsdp_managed_module
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:  # another transformers layout: assume it might
        return True
    return bool(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


def call_blocker(model, args: tuple, kwargs: dict) -> str | None:
    """Why this generate(*args, **kwargs) call keeps HF's loop, judged before HF runs (None: fast)."""
    if len(args) > 1:
        return "positional arguments"
    for name in _LOOP_ARGS:
        if kwargs.get(name) is not None:
            return name
    if model.config.is_encoder_decoder:
        return "encoder-decoder model"
    # HF turns synced_gpus on by itself under FSDP / ZeRO-3; a custom_generate callable loses it.
    # (Tensor parallelism does not: every rank runs the same steps, mirage_serve.tp.)
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1 and _synced_gpus(model):
        return "distributed"
    rest = {k: v for k, v in kwargs.items() if k not in ("generation_config", "input_ids", "inputs")}
    try:
        gc, model_kwargs = model._prepare_generation_config(kwargs.get("generation_config"), **rest)
    except Exception as e:  # HF raises the same on its own path, with its own message
        return f"generation config: {type(e).__name__}"
    extra = sorted(set(model_kwargs) - _CALL_MODEL_KWARGS)
    if extra:
        return f"model kwarg {extra[0]}"
    mode = gc.get_generation_mode(None)
    if mode not in _MODES:
        return f"generation mode {mode.value}"
    if gc.num_return_sequences != 1:
        return "num_return_sequences"
    if gc.return_dict_in_generate:
        return "return_dict_in_generate"
    for flag in _OUTPUT_FLAGS:
        if getattr(gc, flag, False):
            return flag
    return None


def loop_blocker(model, input_ids, logits_processor, stopping_criteria, model_kwargs: dict,
                 owns_cache) -> str | None:
    """Why the prepared call keeps HF's loop (None: the graphed loop reproduces it)."""
    for c in stopping_criteria:
        if type(c) not in (MaxLengthCriteria, EosTokenCriteria):
            return f"stopping criterion {type(c).__name__}"
    if not any(type(c) is MaxLengthCriteria for c in stopping_criteria):
        return "no max_length"
    _, _, reason = plan_processors(logits_processor, int(input_ids.shape[1]))
    if reason:
        return reason
    extra = sorted(set(model_kwargs) - _LOOP_MODEL_KWARGS)
    if extra:
        return f"model kwarg {extra[0]}"
    if not model_kwargs.get("use_cache", False):
        return "use_cache=False"
    cache = model_kwargs.get(CACHE_KWARG)
    if not owns_cache(cache):
        return "foreign cache"
    max_length = next(c.max_length for c in stopping_criteria if type(c) is MaxLengthCriteria)
    why = window_layers.why_not_graphable(cache, max_length)  # static and sliding-window layers
    if why:
        return why
    if model.config._attn_implementation not in ("sdpa", "eager"):
        return f"attention {model.config._attn_implementation}"
    pos = model_kwargs.get("position_ids")
    if pos is None or pos.ndim != 2:
        return "position ids"
    if input_ids.device != model.device:
        return "input_ids on another device"
    return None


def fast_sample(runner, model, input_ids, logits_processor, stopping_criteria, generation_config,
                **model_kwargs):
    """HF's ``_sample`` for a supported call: HF's prefill, then the graphed ``DecodeLoop``."""
    reason = loop_blocker(model, input_ids, logits_processor, stopping_criteria, model_kwargs,
                          runner.pool.owns)
    max_length = next((c.max_length for c in stopping_criteria if type(c) is MaxLengthCriteria), 0)
    width = int(input_ids.shape[1])
    if reason is None and max_length - width < 1:
        reason = "no new tokens"
    if reason is not None:
        runner.count_path("hf", reason)
        return type(model)._sample(model, input_ids, logits_processor=logits_processor,
                                   stopping_criteria=stopping_criteria,
                                   generation_config=generation_config, **model_kwargs)
    runner.count_path("fast")
    warpers, min_new, _ = plan_processors(logits_processor, width)
    chooser = TokenChooser(warpers, bool(generation_config.do_sample))
    cache = model_kwargs[CACHE_KWARG]
    prompt_mask = model_kwargs.get("attention_mask")  # None: HF dropped an all-ones mask
    extra = {k: model_kwargs[k] for k in ("use_cache", "logits_to_keep") if k in model_kwargs}

    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)
    model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
    first_logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
    del outputs  # the prefill logits can be large

    loop = runner.loop_for(cache, int(input_ids.shape[0]), chooser, extra)
    loop.start(prompt_mask, width, model_kwargs["position_ids"][..., -1:],
               generation_config._eos_token_tensor, generation_config._pad_token_tensor, min_new,
               first_logits)
    with model._optimize_model_for_decode():
        new_tokens = loop.run(max_length - width)
    return torch.cat([input_ids, new_tokens], dim=-1)
