"""A/B of the decode loop inside a patched model's generate(): HF's loop vs the graphed fast loop.

Same process, same model, same owned static cache: the runner's ``fast_loop`` switch is the only
difference. Prints ms per decode step (bench_timing.decode_step_time: (t(N) − t(1)) / (N − 1),
medians), the ratio, whether the greedy tokens of both loops are identical, and which loop each
generate() call really ran (``decode_paths``).

    python benchmarks/bench_fast_loop.py Qwen2.5-0.5B --batch 1,8 --new-tokens 128 [--no-patch]
    python benchmarks/bench_fast_loop.py SmolLM2-135M --device cpu --layers 2 --new-tokens 8  # smoke
"""
from __future__ import annotations

import argparse


def _ids(batch: int, length: int, vocab: int, device: str):
    import torch

    g = torch.Generator().manual_seed(batch)
    return torch.randint(3, vocab, (batch, length), generator=g).to(device)


def measure(model, batches, prompt_len: int, new_tokens: int, repeats: int, device: str) -> list[dict]:
    """Per batch: ms/step on HF's loop and on the fast loop, and whether their tokens agree."""
    from mirage_serve.bench_timing import decode_step_time
    from mirage_serve.decode import decode_paths

    runner = model._mirage_decode_runner
    rows = []
    for b in batches:
        ids = _ids(b, prompt_len, model.config.vocab_size, device)
        row = {"batch": b}
        for name, fast in (("hf_loop", False), ("fast_loop", True)):
            runner.fast_loop = fast
            before = decode_paths(model)
            step_s, tokens = decode_step_time(model, ids, new_tokens, "dynamic", device, repeats)
            after = decode_paths(model)
            row[name + "_ms"] = step_s * 1e3
            row[name + "_tokens"] = tokens
            row[name + "_paths"] = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        row["same_tokens"] = bool((row.pop("hf_loop_tokens") == row.pop("fast_loop_tokens")).all())
        rows.append(row)
    runner.fast_loop = True
    return rows


def main(argv=None) -> None:
    import torch

    from mirage_serve.bench_load import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--no-patch", dest="patch", action="store_false")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batch.split(",")]
    dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    lm = load(args.model, dtype=dtype, device=args.device, layers=args.layers)
    from mirage_serve.decode import install_decode_graphs

    if args.patch:
        import mirage_serve

        kw = {} if args.device.startswith("cuda") else {"backend": "torch", "search_budget": 0}
        print(mirage_serve.patch(lm.model, batch_sizes=tuple(batches), **kw))
    if getattr(lm.model, "_mirage_decode_runner", None) is None:  # --no-patch, or patch on CPU
        install_decode_graphs(lm.model)
    rows = measure(lm.model, batches, args.prompt_len, args.new_tokens, args.repeats, args.device)
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"{dev}; {lm.name} {dtype}, {'patched' if args.patch else 'unpatched'}; prompt {args.prompt_len}, "
          f"{args.new_tokens} new tokens, median of {args.repeats}")
    print(f"{'batch':>5} {'HF loop ms/step':>16} {'fast loop ms/step':>18} {'speed-up':>9} {'same tokens':>12}  paths")
    for r in rows:
        print(f"{r['batch']:>5} {r['hf_loop_ms']:>16.3f} {r['fast_loop_ms']:>18.3f} "
              f"{r['hf_loop_ms'] / max(r['fast_loop_ms'], 1e-9):>8.2f}x {str(r['same_tokens']):>12}  "
              f"hf_loop={r['hf_loop_paths']} fast_loop={r['fast_loop_paths']}")


if __name__ == "__main__":
    main()
