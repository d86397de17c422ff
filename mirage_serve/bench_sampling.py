"""Sampling agreement for `mirage-serve bench`: the patched model against eager under ``do_sample``.

Greedy tokens only show the argmax; sampling draws from the whole distribution, so the check here
compares the logits themselves. Per batch, with the same prompts and the same seed:

* eager (unpatched, HF's dynamic cache) samples ``steps`` tokens and returns every step's logits;
* the patched model does the same with ``output_logits`` (that keeps HF's decode loop, running our
  kernels): its logits are compared with eager's at every step whose history agrees — the sampled
  tokens before it are the same in every row — as the tolerance table compares outputs (relative
  Frobenius error), and the largest absolute difference is reported alongside;
* the patched model samples again without output flags (on CUDA: the graphed fast loop): its
  tokens are compared with eager's (the same seed and distributions give the same draws, unless a
  draw lands within rounding of a boundary between two tokens).

Step 0 is the prefill (the original modules for a prompt longer than the largest bucket); step 1 is
the first decode step through the kernels, the "first-token logits" of a sampled continuation.
"""
from __future__ import annotations

STEPS = 16  # sampled steps per batch (at most the bench's new tokens)


def sample(model, ids, steps: int, seed: int, with_logits: bool):
    """(new tokens [B, steps], logits [B, steps, V] float32 on the CPU or None) of one sampled generate()."""
    import torch

    torch.manual_seed(seed)  # also seeds every CUDA device
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                  do_sample=True, pad_token_id=0)
    if with_logits:
        kwargs.update(return_dict_in_generate=True, output_logits=True)
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    width = ids.shape[1]
    if not with_logits:
        return out[:, width:].cpu(), None
    return out.sequences[:, width:].cpu(), torch.stack(out.logits, dim=1).float().cpu()


def compare(ref: tuple, got: tuple, fast_tokens, tolerance: float) -> dict:
    """The record of one batch: ``ref``/``got`` are ``sample(..., with_logits=True)`` of eager and
    of the patched model, ``fast_tokens`` the patched model's plain (fast-loop) sample."""
    ref_tokens, ref_logits = ref
    got_tokens, got_logits = got
    steps = ref_tokens.shape[1]
    # logits at step s depend on the tokens before s: compare while every row's history agrees
    differs = (ref_tokens != got_tokens).any(dim=0).nonzero()
    agree = int(differs[0]) + 1 if len(differs) else steps
    per_step = []
    for s in range(agree):
        a, b = ref_logits[:, s].double(), got_logits[:, s].double()
        per_step.append({"step": s, "max_abs": float((a - b).abs().max()),
                         "rel": float((a - b).norm() / a.norm().clamp_min(1e-300))})
    worst = max(per_step, key=lambda r: r["rel"])
    fast_differs = (ref_tokens != fast_tokens).any(dim=0).nonzero()
    return {"steps": steps, "steps_compared": agree, "tolerance": tolerance,
            "first_decode_step": per_step[1] if agree > 1 else None, "worst": worst,
            "ok": worst["rel"] <= tolerance,
            "fast_loop_first_divergence": int(fast_differs[0]) if len(fast_differs) else None}


def summary(records: dict) -> str:
    """One line for the report: ``records`` maps batch -> ``compare`` record."""
    if not records:
        return "not checked (patch() did not run)"
    parts = []
    for b, r in records.items():
        first = r["first_decode_step"]
        head = "OK" if r["ok"] else "FAILED"
        text = (f"batch {b} {head}: first decode step's logits max |diff| {first['max_abs']:.3g} "
                f"(rel {first['rel']:.2e})" if first else f"batch {b} {head}: tokens differ from step 0")
        text += (f", worst rel {r['worst']['rel']:.2e} (tolerance {r['tolerance']:.0e}) over "
                 f"{r['steps_compared']}/{r['steps']} steps with the same history; plain generate() "
                 + ("samples the same tokens" if r["fast_loop_first_divergence"] is None
                    else f"samples another token at step {r['fast_loop_first_divergence']}"))
        parts.append(text)
    return "; ".join(parts)
