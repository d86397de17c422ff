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

Two bf16 runs of a deep model disagree by more than the tolerance table's bf16 entry even when both
are as exact as bf16 allows: that entry bounds an error against a float64 reference, and a
26-layer model amplifies each op's rounding. With the bench's random weights HF's own eager bf16
logits are 1.2e-2 (Phi-3-mini), 1.9e-2 (Gemma-2-2B) and 2.0e-2 (Gemma-3-1B) away from a float32
run of the same weights (relative Frobenius, CPU; docs/results.md). So the check also takes a
higher-precision ``reference``: eager's sampled tokens teacher-forced through the unpatched model
widened to float32. Where the two bf16 runs disagree beyond the tolerance, the patched model passes
only if it is as close to that reference as eager is (``ACCURACY_MARGIN``): a kernel that computes
something else is farther from it, while a second rounding of the same math is not.
"""
from __future__ import annotations

STEPS = 16  # sampled steps per batch (at most the bench's new tokens)
# How much farther from the reference than eager the patched model's logits may be at a step. Two
# roundings of the same math land at about the same distance (ratios 0.97-1.05 per step on the CPU
# emulation of Gemma-2-2B's kernels); logits 5% off are more than twice as far as eager's 2e-2.
ACCURACY_MARGIN = 1.25


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


def reference(model, ids, tokens, dtype=None):
    """Logits [B, steps, V] (float32, CPU) of the unpatched ``model`` widened to ``dtype`` (default
    float32) at each step of the sampled continuation ``tokens`` [B, steps] of ``ids``: the sequence
    teacher-forced in one forward, so every step has the history eager sampled.

    The model's tensors are widened in place for the forward and then given back their own storage:
    no copy of the model (a deep copy holds the narrow weights twice beside the wide ones, 64 GB at
    the peak for an 8B model), and nothing that recorded a weight's address (a CUDA graph of HF's
    compiled static-cache baseline) sees it move."""
    import torch

    dtype = dtype or torch.float32
    seq = torch.cat([ids, tokens.to(ids.device)], dim=1)
    width, steps = ids.shape[1], tokens.shape[1]
    kept = {}
    precision = torch.get_float32_matmul_precision()  # "high" (set by compile baselines) means tf32 matmuls
    try:
        _widen(model, dtype, kept)
        torch.set_float32_matmul_precision("highest")
        with torch.inference_mode():
            logits = model(seq, attention_mask=torch.ones_like(seq)).logits
        # the logits at position p predict token p + 1: step s is predicted at width - 1 + s
        return logits[:, width - 1:width - 1 + steps].float().cpu()
    finally:
        torch.set_float32_matmul_precision(precision)
        for (m, name, is_param), t in kept.items():
            if is_param:
                m._parameters[name].data = t
            else:
                m._buffers[name] = t


def _widen(model, dtype, kept: dict) -> None:
    """Every floating parameter and buffer narrower than ``dtype`` widened in place; ``kept`` maps
    (module, name, is parameter) to the original tensor. A tied weight (one Parameter in two
    modules) is widened once, through its first module."""
    seen = set()
    for m in model.modules():
        for name, t in list(m._parameters.items()) + list(m._buffers.items()):
            if t is None or not t.is_floating_point() or t.element_size() >= dtype.itemsize or id(t) in seen:
                continue
            seen.add(id(t))
            is_param = name in m._parameters
            kept[(m, name, is_param)] = t.data if is_param else t
            if is_param:
                t.data = t.data.to(dtype)
            else:
                m._buffers[name] = t.to(dtype)


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def compare(ref: tuple, got: tuple, fast_tokens, tolerance: float, reference=None) -> dict:
    """The record of one batch: ``ref``/``got`` are ``sample(..., with_logits=True)`` of eager and
    of the patched model, ``fast_tokens`` the patched model's plain (fast-loop) sample;
    ``reference``: ``reference(...)`` of eager's tokens, or None (then only the agreement counts)."""
    ref_tokens, ref_logits = ref
    got_tokens, got_logits = got
    steps = ref_tokens.shape[1]
    # logits at step s depend on the tokens before s: compare while every row's history agrees
    differs = (ref_tokens != got_tokens).any(dim=0).nonzero()
    agree = int(differs[0]) + 1 if len(differs) else steps
    per_step = []
    for s in range(agree):
        a, b = ref_logits[:, s].double(), got_logits[:, s].double()
        step = {"step": s, "max_abs": float((a - b).abs().max()), "rel": _rel(b, a)}
        if reference is not None:
            r = reference[:, s].double()
            step.update(eager_vs_reference=_rel(a, r), ours_vs_reference=_rel(b, r))
        per_step.append(step)
    worst = max(per_step, key=lambda r: r["rel"])
    agrees = worst["rel"] <= tolerance
    fast_differs = (ref_tokens != fast_tokens).any(dim=0).nonzero()
    record = {"steps": steps, "steps_compared": agree, "tolerance": tolerance,
              "first_decode_step": per_step[1] if agree > 1 else None, "worst": worst,
              "agrees": agrees, "ok": agrees,
              "fast_loop_first_divergence": int(fast_differs[0]) if len(fast_differs) else None}
    if reference is not None:
        # per step: the patched logits as close to the wide reference as eager's (or within tolerance)
        ratio = max(per_step, key=lambda r: r["ours_vs_reference"] / max(r["eager_vs_reference"], 1e-300))
        accurate = all(r["ours_vs_reference"] <= max(tolerance, ACCURACY_MARGIN * r["eager_vs_reference"])
                       for r in per_step)
        record.update(reference_worst=ratio, as_accurate_as_eager=accurate, ok=agrees or accurate)
    return record


def summary(records: dict) -> str:
    """One line for the report: ``records`` maps batch -> ``compare`` record."""
    if not records:
        return "not checked (patch() did not run)"
    parts = []
    for b, r in records.items():
        first = r["first_decode_step"]
        head = "OK" if r["ok"] else "FAILED"
        if r["ok"] and not r.get("agrees", True):
            head = "OK (as accurate as eager)"
        text = (f"batch {b} {head}: first decode step's logits max |diff| {first['max_abs']:.3g} "
                f"(rel {first['rel']:.2e})" if first else f"batch {b} {head}: tokens differ from step 0")
        w = r.get("reference_worst")
        if w is not None:  # both bf16 runs against the float32 reference, at the step where ours is farthest behind
            text += (f"; against float32 at step {w['step']}: ours {w['ours_vs_reference']:.2e}, "
                     f"eager {w['eager_vs_reference']:.2e} (margin {ACCURACY_MARGIN}x)")
        text += (f", worst rel {r['worst']['rel']:.2e} (tolerance {r['tolerance']:.0e}) over "
                 f"{r['steps_compared']}/{r['steps']} steps with the same history; plain generate() "
                 + ("samples the same tokens" if r["fast_loop_first_divergence"] is None
                    else f"samples another token at step {r['fast_loop_first_divergence']}"))
        parts.append(text)
    return "; ".join(parts)
