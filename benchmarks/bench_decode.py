"""End-to-end decode benchmark (BENCHMARKS.md §3): ms per decode step inside model.generate().

For each registry model and batch size, in one process: HF eager (dynamic cache), HF static cache +
auto torch.compile, and mirage_serve (patched kernels where available + owned static cache +
CUDA-graph decode steps), each timed as (t(N new tokens) − t(1)) ÷ (N − 1), plus the bandwidth
floor (weight bytes per step ÷ device copy bandwidth measured in the same run). Random weights,
normal_(0, 0.02), fixed seed; greedy; fixed length via min_new_tokens.

    PYTHONPATH=$PWD python benchmarks/bench_decode.py --models Qwen2.5-0.5B,Llama-3.1-8B --batch 1,8
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import torch

from mirage_serve import registry
from mirage_serve.bench_timing import copy_bandwidth, decode_step_time, first_divergence
from mirage_serve.decode import install_decode_graphs, uninstall_decode_graphs


def build(name: str, dtype=torch.bfloat16, seed: int = 0, layers: int | None = None):
    from transformers import AutoModelForCausalLM

    entry = registry.get(name)
    facts = dict(entry.config)
    if layers:
        facts["num_hidden_layers"] = layers
    cfg = registry.hf_config(facts)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():  # from_config under a device context may leave memory uninitialised
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    return model, facts


def patch_ours(model, kernels: bool):
    """Our path: patched kernels (if asked and the patcher is available) + CUDA-graph decode steps."""
    report = None
    if not kernels:
        install_decode_graphs(model)
        return report
    try:
        import mirage_serve

        report = mirage_serve.patch(model, cuda_graphs=False)
    except (ImportError, AttributeError, TypeError) as e:  # patcher not there yet: graphs only
        print(f"  (kernels not patched: {e})", file=sys.stderr)
    install_decode_graphs(model)
    return report


def run(args) -> list[dict]:
    bw = copy_bandwidth("cuda")
    print(f"device {torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for name in args.models.split(","):
        model, facts = build(name, layers=args.layers)
        floor = registry.decode_bytes(facts) / bw
        for batch in (int(b) for b in args.batch.split(",")):
            g = torch.Generator(device="cuda").manual_seed(1)
            ids = torch.randint(1, facts["vocab_size"], (batch, args.prompt_len), device="cuda", generator=g)
            row = dict(model=name, batch=batch, floor_ms=floor * 1e3)
            t, ref = decode_step_time(model, ids, args.new_tokens, "dynamic", "cuda", args.repeats)
            row["eager_ms"] = t * 1e3
            if "static-compile" in args.baselines:
                t0 = time.perf_counter()
                t, _ = decode_step_time(model, ids, args.new_tokens, "static", "cuda", args.repeats)
                row["compile_ms"], row["compile_total_s"] = t * 1e3, time.perf_counter() - t0
            t0 = time.perf_counter()
            patch_ours(model, args.kernels)
            row["patch_s"] = time.perf_counter() - t0
            t, got = decode_step_time(model, ids, args.new_tokens, "dynamic", "cuda", args.repeats)
            row["ours_ms"] = t * 1e3
            row["divergence"] = first_divergence(ref, got)
            uninstall_decode_graphs(model)
            try:
                import mirage_serve

                mirage_serve.unpatch(model)
            except (ImportError, AttributeError):
                pass
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    return rows, bw


def table(rows, bw) -> str:
    head = ("| model | batch | eager ms | static+compile ms | ours ms | ours vs eager | ours vs compile "
            "| floor ms | % of floor BW | tokens vs eager |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        c = r.get("compile_ms")
        div = "identical" if r["divergence"] is None else f"diverge at step {r['divergence']['step']}"
        compile_ms, vs_compile = (f"{c:.2f}", f"{c / r['ours_ms']:.2f}×") if c else ("–", "–")
        lines.append(f"| {r['model']} | {r['batch']} | {r['eager_ms']:.2f} | {compile_ms} | {r['ours_ms']:.2f} | "
                     f"{r['eager_ms'] / r['ours_ms']:.2f}× | {vs_compile} | {r['floor_ms']:.2f} | "
                     f"{100 * r['floor_ms'] / r['ours_ms']:.0f}% | {div} |")
    meta = (f"device {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, torch {torch.__version__}, "
            f"transformers {__import__('transformers').__version__}, python {platform.python_version()}, "
            f"{datetime.date.today()}; command: python benchmarks/bench_decode.py {' '.join(sys.argv[1:])}")
    return meta + "\n\n" + "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Llama-3.1-8B,Qwen2.5-0.5B,Qwen3-8B")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None, help="cut every model to this many layers")
    ap.add_argument("--baselines", default="eager,static-compile")
    ap.add_argument("--no-kernels", dest="kernels", action="store_false",
                    help="CUDA-graph decode steps over HF's own modules, no patched kernels")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    args = ap.parse_args(argv)
    rows, bw = run(args)
    text = table(rows, bw)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
