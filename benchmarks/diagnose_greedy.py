"""Why a bench's greedy check diverges from eager: kernels, or the graphed loop, or bf16 noise?

    python benchmarks/diagnose_greedy.py Gemma-3-1B --batch 8 --steps 16

The bench's prompts and weights (``bench._prompt``, ``bench_load``, seed 0), then four greedy runs of
``--steps`` tokens on the same prompts:

* eager (HF, unpatched) with its logits, and those logits' float32 reference along eager's tokens
  (``bench_sampling.reference``: the unpatched model widened to float32, teacher-forced);
* patched, plain ``generate()``: the graphed decode loop, as the bench's greedy check runs it;
* patched with ``output_logits``: HF's own loop over the same patched kernels (what the sampling
  check compares), so a divergence only the graphed loop shows points at the loop, not the kernels;
  once on HF's default cache (the model's own attention: a dynamic cache takes no decode-attention
  kernel) and once on HF's static cache (the decode-attention kernels, no CUDA graphs);
* patched at batch 1, the first divergent row alone: the batch-1 kernels on that row's history.

Then per step, while eager and the patched HF-loop run share their history: each run's relative
logit error against float32 (worst row), and at the graphed loop's first divergence the float32 gap
between the two tokens with each bf16 run's error on it. Meant for a CUDA GPU (``--device cpu
--layers 2`` to try it).
"""
from __future__ import annotations

import argparse


def _greedy(model, ids, steps: int, with_logits: bool, static: bool = False):
    """(tokens [B, steps], float32 logits [B, steps, V] on the CPU or None); ``static``: HF's static
    cache without its auto-compile (the decode-attention kernels run on it, without CUDA graphs)."""
    import torch

    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                  do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    if static:
        kwargs.update(cache_implementation="static", disable_compile=True)
    if with_logits:
        kwargs.update(return_dict_in_generate=True, output_logits=True)
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    if not with_logits:
        return out[:, ids.shape[1]:], None
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, dim=1).float().cpu()


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _divergence(ref, got) -> tuple[int, int] | None:
    from mirage_serve.bench_timing import first_divergence

    d = first_divergence(ref.cpu(), got.cpu())
    return None if d is None else (d["step"], d["row"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="registry name, e.g. Gemma-3-1B")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--layers", type=int, default=None, help="cut the model to N layers (a quick try)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    from mirage_serve import bench, bench_sampling
    from mirage_serve.bench_load import load
    from mirage_serve.patching.pipeline import patch

    lm = load(args.model, dtype="bf16", device=args.device, layers=args.layers, seed=0)
    model, b = lm.model, args.batch
    ids = bench._prompt(b, args.prompt_len, model.config.vocab_size, 0, args.device)
    eager, eager_logits = _greedy(model, ids, args.steps, True)
    wide = bench_sampling.reference(model, ids, eager)  # [B, S, V]
    patch(model, batch_sizes=(1, b))
    graphed, _ = _greedy(model, ids, args.steps, False)
    looped = {"HF loop": _greedy(model, ids, args.steps, True),
              "HF loop, static cache": _greedy(model, ids, args.steps, True, static=True)}

    print(f"== {args.model} b{b}, {args.steps} greedy steps, prompt {args.prompt_len}")
    runs = {"graphed loop": graphed} | {name: toks for name, (toks, _) in looped.items()}
    for name, toks in runs.items():
        d = _divergence(eager, toks)
        verdict = "identical to eager" if d is None else f"diverges at step {d[0]}, row {d[1]}"
        print(f"patched, {name:22s}: {verdict}")
    print("relative logit error against float32 (worst row), while the run's history is eager's:")
    print("step  eager     " + "  ".join(f"{name:22s}" for name in looped))
    shared = {}
    for name, (toks, _) in looped.items():
        d = _divergence(eager, toks)
        shared[name] = args.steps if d is None else d[0] + 1  # steps whose logits saw eager's history
    for s in range(args.steps):
        e = max(_rel(eager_logits[r, s], wide[r, s]) for r in range(b))
        cells = [f"{max(_rel(lg[r, s], wide[r, s]) for r in range(b)):<22.3e}" if s < shared[name] else f"{'-':22s}"
                 for name, (_, lg) in looped.items()]
        print(f"{s:4d}  {e:.3e} " + "  ".join(cells))
    g = _divergence(eager, graphed)
    if g is None:
        return
    s, r = g
    want, got = int(eager[r, s]), int(graphed[r, s])
    gap32 = float(wide[r, s, want] - wide[r, s, got])
    gap_e = float(eager_logits[r, s, want] - eager_logits[r, s, got])
    print(f"graphed divergence step {s} row {r}: eager {want}, patched {got}; float32 gap {gap32:.4f}, "
          f"eager's bf16 gap {gap_e:.4f} (error {abs(gap_e - gap32):.4f})")
    for name, (_, lg) in looped.items():
        if s < shared[name]:
            gap_o = float(lg[r, s, want] - lg[r, s, got])
            print(f"  patched {name}: gap there {gap_o:.4f} (error {abs(gap_o - gap32):.4f}), its top token "
                  f"{int(lg[r, s].argmax())}, relative error {_rel(lg[r, s], wide[r, s]):.3e} "
                  f"(eager {_rel(eager_logits[r, s], wide[r, s]):.3e})")
    # the spread of bf16 gap errors at that step: eager against float32 over the top 64 float32 tokens
    top = wide[r, s].topk(64).indices
    errs = ((eager_logits[r, s, top] - eager_logits[r, s, want]) - (wide[r, s, top] - wide[r, s, want])).abs()
    print(f"  eager's gap errors to the top-64 float32 tokens: median {errs.median():.4f}, max {errs.max():.4f}")
    alone, _ = _greedy(model, ids[r:r + 1], args.steps, False)
    a = _divergence(eager[r:r + 1], alone)
    print(f"row {r} alone at batch 1 (graphed): " + ("identical to eager" if a is None else f"diverges at step {a[0]}"))


if __name__ == "__main__":
    main()
