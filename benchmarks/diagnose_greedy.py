"""Why a bench's greedy check diverges from eager: kernels, or the graphed loop, or bf16 noise?

    python benchmarks/diagnose_greedy.py Gemma-3-1B --batch 8 --steps 16

The bench's prompts and weights (``bench._prompt``, ``bench_load``, seed 0), then five greedy runs of
``--steps`` tokens on the same prompts:

* eager (HF, unpatched) with its logits, and those logits' float32 reference along eager's tokens
  (``bench_sampling.reference``: the unpatched model widened to float32, teacher-forced);
* patched, plain ``generate()``: the graphed decode loop, as the bench's greedy check runs it;
* patched with ``output_logits``: HF's own loop over the same patched kernels, on the patch's own
  static cache (so the decode-attention kernels and the per-step CUDA graphs run too; what the
  sampling check compares): a divergence only the graphed loop shows points at the loop, not the kernels;
* the graphed loop's code without CUDA graphs (``DecodeLoop`` run step by step), with its logits:
  against the HF loop's (the same kernels), a difference is the loop's inputs (mask, positions) or
  kernels that do not give the same bits on every launch (atomic cross-block sums), not the graph;
* patched at batch 1, the first divergent row alone: the batch-1 kernels on that row's history.

Then per step, while eager and the patched HF-loop run share their history: each run's relative
logit error against float32 (worst row), and at the graphed loop's first divergence the float32 gap
between the two tokens with each bf16 run's error on it. Meant for a CUDA GPU (``--device cpu
--layers 2`` to try it).
"""
from __future__ import annotations

import argparse


def _greedy(model, ids, steps: int, with_logits: bool):
    """(tokens [B, steps], float32 logits [B, steps, V] on the CPU or None)."""
    import torch

    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=steps, min_new_tokens=steps,
                  do_sample=False, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    if with_logits:
        kwargs.update(return_dict_in_generate=True, output_logits=True)
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    if not with_logits:
        return out[:, ids.shape[1]:], None
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, dim=1).float().cpu()


def _loop_uncaptured(model, ids, steps: int):
    """The graphed loop's own code (``DecodeLoop``) run step by step without CUDA graphs (the
    runner's ``capture`` off), with the float32 logits each step chose from [B, steps, V]."""
    import torch

    from mirage_serve.decode import fast_loop
    from mirage_serve.decode.runner import _ATTR

    runner, real, seen = getattr(model, _ATTR), fast_loop.DecodeLoop._advance, []

    def record(loop, logits):
        seen.append(logits.float().cpu())
        real(loop, logits)

    saved = runner.capture, runner.loops, runner.steps
    runner.capture, runner.loops, runner.steps = False, {}, {}
    fast_loop.DecodeLoop._advance = record
    try:
        tokens, _ = _greedy(model, ids, steps, False)
    finally:
        fast_loop.DecodeLoop._advance = real
        runner.capture, runner.loops, runner.steps = saved
    return tokens, torch.stack(seen[:steps], dim=1)


def _loop_graphed(model, ids, steps: int):
    """The graphed loop again, in fresh loops, with the float32 logits of every step [B, steps, V]:
    each step copies its logits into a device buffer at the step's index (``t``, on the device), a copy
    the capture records with the rest of the step, so replays keep it."""
    import torch

    from mirage_serve.decode import fast_loop
    from mirage_serve.decode.runner import _ATTR

    runner, real, bufs = getattr(model, _ATTR), fast_loop.DecodeLoop._advance, {}

    def record(loop, logits):
        if id(loop) not in bufs:  # first called from start(), outside any capture
            bufs[id(loop)] = torch.zeros(steps, *logits.shape, dtype=torch.float32, device=logits.device)
        buf = bufs[id(loop)]
        buf.index_copy_(0, loop.t.clamp(max=steps - 1).view(1), logits.float()[None])
        real(loop, logits)

    saved = runner.loops, runner.steps
    runner.loops, runner.steps = {}, {}
    fast_loop.DecodeLoop._advance = record
    try:
        tokens, _ = _greedy(model, ids, steps, False)
    finally:
        fast_loop.DecodeLoop._advance = real
        runner.loops, runner.steps = saved
    (buf,) = bufs.values()
    return tokens, buf.transpose(0, 1).cpu()


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
    from mirage_serve.bench_sampling import _rel  # the sampling check's relative error
    from mirage_serve.bench_load import load
    from mirage_serve.patching.pipeline import patch

    lm = load(args.model, dtype="bf16", device=args.device, layers=args.layers, seed=0)
    model, b = lm.model, args.batch
    ids = bench._prompt(b, args.prompt_len, model.config.vocab_size, 0, args.device)
    eager, eager_logits = _greedy(model, ids, args.steps, True)
    wide = bench_sampling.reference(model, ids, eager)  # [B, S, V]
    patch(model, batch_sizes=(1, b))
    if args.device == "cpu":  # no CUDA graphs off the GPU: the runner alone, so the loop still runs
        from mirage_serve.decode.runner import install_decode_graphs
        install_decode_graphs(model, capture=False)
    # the decode-attention kernels' first-use check runs on the first decode step after patch(), and the
    # original forward's output stands for that step: spend it here, so every run below is the kernels'
    _greedy(model, ids, 2, False)
    graphed, _ = _greedy(model, ids, args.steps, False)
    looped, looped_logits = _greedy(model, ids, args.steps, True)
    plain, plain_logits = _loop_uncaptured(model, ids, args.steps)
    graphed2, graphed_logits = _loop_graphed(model, ids, args.steps)

    print(f"== {args.model} b{b}, {args.steps} greedy steps, prompt {args.prompt_len}")
    for name, toks in (("patched, graphed loop", graphed), ("patched, HF loop", looped),
                       ("patched, loop uncaptured", plain)):
        d = _divergence(eager, toks)
        verdict = "identical to eager" if d is None else f"diverges at step {d[0]}, row {d[1]}"
        print(f"{name:24s}: {verdict}")
    d = _divergence(eager, looped)
    shared = args.steps if d is None else d[0] + 1  # steps whose logits saw the same history
    print("step  eager vs f32  patched(HF loop) vs f32  patched vs eager   (relative, worst row)")
    for s in range(shared):
        e = max(_rel(eager_logits[r, s], wide[r, s]) for r in range(b))
        o = max(_rel(looped_logits[r, s], wide[r, s]) for r in range(b))
        x = max(_rel(looped_logits[r, s], eager_logits[r, s]) for r in range(b))
        print(f"{s:4d}  {e:12.3e}  {o:23.3e}  {x:16.3e}")
    d = _divergence(looped, plain)
    both = args.steps if d is None else d[0] + 1
    diffs = [float((plain_logits[:, t] - looped_logits[:, t]).abs().max()) for t in range(both)]
    print("uncaptured loop's logits against the HF loop's, max |diff| per step: "
          + " ".join(f"{x:.3g}" for x in diffs))
    d = _divergence(plain, graphed2)
    both = args.steps if d is None else d[0] + 1
    diffs = [float((graphed_logits[:, t] - plain_logits[:, t]).abs().max()) for t in range(both)]
    print("graphed loop's logits (fresh capture, " + ("same tokens as the first graphed run" if
          _divergence(graphed, graphed2) is None else "OTHER tokens than the first graphed run")
          + ") against the uncaptured loop's, max |diff| per step: " + " ".join(f"{x:.3g}" for x in diffs))
    g2 = _divergence(eager, graphed2)
    shared2 = args.steps if g2 is None else g2[0] + 1
    print("step  graphed vs f32  uncaptured vs f32   (relative, worst row; eager's history)")
    for s in range(shared2):
        gr = max(_rel(graphed_logits[r, s], wide[r, s]) for r in range(b))
        un = max(_rel(plain_logits[r, s], wide[r, s]) for r in range(b))
        print(f"{s:4d}  {gr:14.3e}  {un:17.3e}")
    g = _divergence(eager, graphed)
    if g is None:
        return
    s, r = g
    want, got = int(eager[r, s]), int(graphed[r, s])
    gap32 = float(wide[r, s, want] - wide[r, s, got])
    gap_e = float(eager_logits[r, s, want] - eager_logits[r, s, got])
    print(f"graphed divergence step {s} row {r}: eager {want}, patched {got}; float32 gap {gap32:.4f}, "
          f"eager's bf16 gap {gap_e:.4f} (error {abs(gap_e - gap32):.4f})")
    if s < shared:
        gap_o = float(looped_logits[r, s, want] - looped_logits[r, s, got])
        print(f"  patched HF loop's gap there {gap_o:.4f} (error {abs(gap_o - gap32):.4f}); its top token "
              f"{int(looped_logits[r, s].argmax())}")
    # the spread of bf16 gap errors at that step: eager against float32 over the top 64 float32 tokens
    top = wide[r, s].topk(64).indices
    errs = ((eager_logits[r, s, top] - eager_logits[r, s, want]) - (wide[r, s, top] - wide[r, s, want])).abs()
    print(f"  eager's gap errors to the top-64 float32 tokens: median {errs.median():.4f}, max {errs.max():.4f}")
    p = _divergence(eager, plain)
    if p is None or p[0] >= s:  # the uncaptured loop saw eager's history up to step s: its logits there
        gap_p = float(plain_logits[r, s, want] - plain_logits[r, s, got])
        ours = ((plain_logits[r, s, top] - plain_logits[r, s, want]) - (wide[r, s, top] - wide[r, s, want])).abs()
        print(f"  uncaptured loop's gap there {gap_p:.4f} (error {abs(gap_p - gap32):.4f}); its gap errors to the "
              f"top-64 float32 tokens: median {ours.median():.4f}, max {ours.max():.4f}")
    if g2 is None or g2[0] >= s:  # the fresh graphed loop saw eager's history up to step s
        gap_g = float(graphed_logits[r, s, want] - graphed_logits[r, s, got])
        ours = ((graphed_logits[r, s, top] - graphed_logits[r, s, want]) - (wide[r, s, top] - wide[r, s, want])).abs()
        print(f"  graphed loop's gap there {gap_g:.4f} (error {abs(gap_g - gap32):.4f}); its gap errors to the "
              f"top-64 float32 tokens: median {ours.median():.4f}, max {ours.max():.4f}")
    same = _divergence(plain, graphed)
    print("graphed loop's tokens against the uncaptured loop's: "
          + ("identical" if same is None else f"diverge at step {same[0]}, row {same[1]}"))
    alone, _ = _greedy(model, ids[r:r + 1], args.steps, False)
    a = _divergence(eager[r:r + 1], alone)
    print(f"row {r} alone at batch 1 (graphed): " + ("identical to eager" if a is None else f"diverges at step {a[0]}"))


if __name__ == "__main__":
    main()
