"""`mirage-serve bench`: resolve defaults per device, run bench.run, print the table, write JSON / PNG.

CPU defaults are chosen so the bare command (the README's "run the main job") finishes in a couple of
minutes on 2 cores: fp32, batch 1, prompt 32, 8 new tokens, eager baseline only, the median of three
repetitions (one repetition let a single scheduler hiccup swing a ratio by 3×). On CPU the run checks
correctness; its first line of output says so, because CPU times say nothing about GPU decode speed.
The MODEL argument is checked before torch is imported, so a typo is answered at once.
"""
from __future__ import annotations

import json
import shlex
import sys

from .bench_plot import missing as plot_missing
from .bench_plot import write_plot
from .cli_errors import (EXIT_BAD_CHECKPOINT, EXIT_INCORRECT, EXIT_NO_GPU, EXIT_OK, EXIT_OOM,
                         EXIT_PATCH_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, CliError)

GPU_DEFAULTS = dict(batch=[1, 8], prompt_len=128, new_tokens=256, dtype="bf16",
                    baselines=["eager", "static-compile"], repeats=3)
CPU_DEFAULTS = dict(batch=[1], prompt_len=32, new_tokens=8, dtype="fp32", baselines=["eager"], repeats=3)


def _device(args) -> str:
    import torch

    has_gpu = torch.cuda.is_available()
    if args.device == "cuda" and not has_gpu:
        raise CliError("--device cuda needs a CUDA GPU and none is visible", EXIT_NO_GPU)
    if args.backend == "triton" and (args.device == "cpu" or not has_gpu):
        raise CliError("--backend triton needs a CUDA GPU and none is visible (use --backend torch)",
                       EXIT_NO_GPU)
    return "cuda" if (args.device == "auto" and has_gpu) or args.device == "cuda" else "cpu"


def options(args):
    """BenchOptions from parsed arguments, with per-device defaults for what was not given."""
    from .bench import BenchOptions

    device = _device(args)
    d = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS

    def pick(value, key):
        return d[key] if value is None else value

    if getattr(args, "plot", None) and plot_missing():  # said before anything is timed
        raise CliError(plot_missing(), EXIT_USAGE)
    new_tokens = pick(args.new_tokens, "new_tokens")
    if new_tokens < 2:
        raise CliError("--new-tokens must be at least 2 (step time = (t(N) - t(1)) / (N - 1))", EXIT_USAGE)
    backend = args.backend
    if backend == "auto" and device == "cpu":
        backend = "torch"  # the exact torch executor: the only backend a CPU has
    return BenchOptions(model=args.model, batches=pick(args.batch, "batch"),
                        prompt_len=pick(args.prompt_len, "prompt_len"), new_tokens=new_tokens,
                        dtype=pick(args.dtype, "dtype"), baselines=pick(args.baselines, "baselines"),
                        backend=backend, device=device, layers=args.layers, overrides=dict(args.overrides),
                        repeats=pick(args.repeats, "repeats"), seed=args.seed, cache_dir=args.cache_dir,
                        graphs=args.graphs)


def _load(opts):
    from .bench_load import CheckpointError, HubUnavailableError, load

    print(f"loading {opts.model or 'the embedded default model'} ...", file=sys.stderr, flush=True)
    try:
        return load(opts.model, dtype=opts.dtype, device=opts.device, layers=opts.layers,
                    overrides=opts.overrides, seed=opts.seed)
    except CheckpointError as err:
        raise CliError(str(err), EXIT_BAD_CHECKPOINT) from None
    except HubUnavailableError as err:
        raise CliError(str(err), EXIT_UNAVAILABLE) from None
    except Exception as err:
        if type(err).__name__ == "OutOfMemoryError":
            raise CliError(f"out of GPU memory while loading the model ({opts.dtype}); try --layers N",
                           EXIT_OOM) from None
        raise


def _f(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def format_result(r: dict) -> str:
    """The human-readable report of a result record."""
    m, s, env = r["model"], r["settings"], r["environment"]
    weights = "random weights (normal 0, 0.02)" if m["random_weights"] else "real weights"
    lines = [
        f"model       {m['name']}: {m['source']}",
        f"            {m['model_type']}, {m['num_hidden_layers']} layers, {m['params'] / 1e6:.1f}M params, "
        f"{weights}; {m['decode_bytes'] / 1e9:.3f} GB read per decode step ({s['dtype']})",
        f"run         {s['dtype']} on {s['device']} ({env['device_name']}), prompt {s['prompt_len']}, "
        f"{s['new_tokens']} new tokens, batch {','.join(map(str, s['batches']))}, backend {s['backend']}, "
        f"median of {s['repeats']}"
        + ("" if s.get("graphs", True) else "; ours without CUDA graphs or the fast loop (kernels alone)"),
    ]
    if r["copy_bandwidth_GBps"]:
        samples = " and ".join(f"{b:.0f}" for b in r.get("copy_bandwidth_samples_GBps", []))
        lines.append(f"bandwidth   copy {r['copy_bandwidth_GBps']:.0f} GB/s (read + write, this run; the better of "
                     f"{samples} GB/s, before and after the timed runs) -> floor {r['floor_ms']:.3f} ms/step")
    else:
        lines.append("bandwidth   not measured on CPU (the floor is a GPU quantity)")
    p = r["patch"]
    if p["error"]:
        lines.append(f"patch       {'failed' if p['available'] else 'not run'}: {p['error']}")
    else:
        lines.append(f"patch       {p['seconds']:.2f} s to patch ({_counts_text(p.get('counts'))})")
        lines.append(f"cache       {s['cache_dir']} (kernels searched and compiled here are reused "
                     "by the next patch())")
        w = p.get("warm")
        if w:
            lines.append(f"warm patch  {w['patch_seconds']:.2f} s to patch again over the filled kernel cache "
                         f"({_counts_text(w['counts'])}); first decode step done {w['first_step_seconds']:.2f} s "
                         f"after patch() began")
        if p.get("decode_paths"):
            lines.append("decode loop " + ", ".join(f"{k}: {v}" for k, v in sorted(p["decode_paths"].items())))
        if p.get("decode_attention"):
            lines.append("attention   decode-attention kernels, first-use check per layer: "
                         + ", ".join(f"{v} {k}" for k, v in sorted(p["decode_attention"].items())))
        for why, n in sorted((p.get("attention_kernels") or {}).items()):
            lines.append(f"            {n} layers ran {why}")
    bases = s["baselines"]
    head = f"{'batch':>5}  {'run':<15} {'ms/step':>9} {'tok/s':>9} {'% floor':>8}" + \
        "".join(f" {'vs ' + b:>18}" for b in bases) + f" {'warm-up s':>10}"
    lines += ["", head, "-" * len(head)]
    for row in r["rows"]:
        lines.append(f"{row['batch']:>5}  {row['run']:<15} {row['ms_per_step']:>9.3f} "
                     f"{_f(row['tok_per_s'], '.1f'):>9} {_f(row['pct_of_floor'], '.1f'):>8}" +
                     "".join(f" {_ratio(row['speedup'].get(b)):>18}" for b in bases) +
                     f" {_f(row.get('warmup_seconds'), '.1f'):>10}")
    lines += ["", "warm-up s: the untimed first generate() calls at that batch (HF: its compile; ours: first-use "
              "checks, the attention choice, CUDA-graph captures)", "correctness " + correctness_line(r)]
    if r.get("repeats"):
        lines.append("repeats     " + repeats_line(r))
    spread = spread_line(r)
    if spread:
        lines.append("spread      " + spread)
    if "sampling" in r:
        lines.append("sampling    " + sampling_line(r))
    lines += [f"note        {n}" for n in r["notes"]]
    return "\n".join(lines)


def _counts_text(c: dict | None) -> str:
    if not c or None in c.values():
        return "counts not recorded"
    return (f"{c['searches']} searches, {c['reinstantiated']} re-instantiated, {c['compiles']} compiles, "
            f"{c['cache_hits']} cache hits, {c['programs']} programs")


def format_markdown(r: dict) -> str:
    """The result as a markdown section for benchmarks/results/ (device, versions, command, table)."""
    m, s, env = r["model"], r["settings"], r["environment"]
    bw = r["copy_bandwidth_GBps"]
    lines = [f"## {m['name']} ({'random weights' if m['random_weights'] else 'real weights'}), {s['dtype']}, "
             f"prompt {s['prompt_len']}, {s['new_tokens']} new tokens",
             "",
             f"device {env['device_name']}, copy bandwidth {f'{bw:.0f} GB/s' if bw else 'not measured'}, "
             f"torch {env['torch']}, triton {env['triton']}, transformers {env['transformers']}, "
             f"{env['date']}; `{env['command']}`; floor {_f(r['floor_ms'], '.3f')} ms/step "
             f"({m['decode_bytes'] / 1e9:.2f} GB of weights per step); patch "
             f"{_f(r['patch']['seconds'], '.1f')} s ({_counts_text(r['patch'].get('counts'))})"
             + (f"; warm re-patch {w['patch_seconds']:.1f} s ({_counts_text(w['counts'])}), first decode step "
                f"{w['first_step_seconds']:.1f} s after patch() began" if (w := r['patch'].get('warm')) else "")
             + (f"; decode loop {r['patch']['decode_paths']}" if r['patch'].get('decode_paths') else ""),
             "",
             "| batch | run | ms/step | tok/s | % of floor | "
             + " | ".join(f"vs {b}" for b in s["baselines"]) + " | warm-up s |",
             "|---" * (6 + len(s["baselines"])) + "|"]
    for row in r["rows"]:
        pct = _f(row["pct_of_floor"], ".0f") + ("%" if row["pct_of_floor"] else "")
        lines.append(f"| {row['batch']} | {row['run']} | {row['ms_per_step']:.3f} | "
                     f"{_f(row['tok_per_s'], '.1f')} | {pct} | "
                     + " | ".join(_ratio(row["speedup"].get(b)) for b in s["baselines"])
                     + f" | {_f(row.get('warmup_seconds'), '.1f')} |")
    lines += ["", "correctness: " + correctness_line(r)]
    if r.get("repeats"):
        lines += ["", "repeats: " + repeats_line(r)]
    if r.get("speed_note"):
        lines += ["", r["speed_note"]]
    if "sampling" in r:
        lines += ["", "sampling: " + sampling_line(r)]
    lines.append("")
    return "\n".join(lines)


def correctness_line(r: dict) -> str:
    c, s = r["correctness"], r["settings"]
    if not c["checked"]:
        return "not checked (patch() did not run)"
    where = f"{s['new_tokens']} steps x batch {','.join(map(str, s['batches']))}"
    if c["identical"]:
        return f"OK: greedy tokens identical to eager for {where}"
    d = c["first_divergence"]
    head = "OK (near-tie)" if c.get("near_tie") else "FAILED"
    gap = (f"; eager's logit gap between them {c['logit_gap']:.3g}, tie tolerance {c['tie_tolerance']:.3g}"
           if "logit_gap" in c else "")
    if "float32_gap" in c:
        gap += (f"; re-scored in float32: gap {c['float32_gap']:.3g}, eager's own error on it {c['eager_error']:.3g} "
                f"({'a tie at the model dtype' if c['near_tie'] else 'eager is right beyond that error'})")
    return (f"{head}: greedy tokens diverge from eager at step {d['step']} (batch {d['batch']}, "
            f"row {d['row']}: expected {d['expected']}, got {d['got']}) within {where}{gap}")


def repeats_line(r: dict) -> str:
    """Whether each timed run gave the same greedy tokens every time it ran (bench._repeats)."""
    n = r["settings"]["repeats"]
    parts = []
    for name, per_batch in r["repeats"].items():
        moved = [(b, d) for b, d in per_batch.items() if d is not None]
        parts.append(f"{name} the same tokens in all {n} timed runs" if not moved else
                     f"{name} NOT repeatable: " + ", ".join(f"batch {b} differs from its first run at step "
                                                           f"{d['step']} (row {d['row']})" for b, d in moved))
    return "; ".join(parts)


def spread_line(r: dict) -> str:
    """The repetitions' own step times, max − min over their median, per timed row: a gap between two runs smaller
    than this is not shown by them (docs/measuring.md). Empty where no row has two repetitions."""
    parts = [f"batch {row['batch']} {row['run']} {row['spread_pct']:.1f}%" for row in r["rows"]
             if row.get("spread_pct") is not None]
    if not parts:
        return ""
    return f"of the {r['settings']['repeats']} repetitions' step times (max - min over median): " + ", ".join(parts)


def sampling_line(r: dict) -> str:
    from .bench_sampling import summary
    return f"seed {r['settings']['seed']}, do_sample with the model's defaults; " + summary(r["sampling"])


def speed_note(opts) -> str | None:
    """The CPU warning, printed before anything else on CPU (None on a GPU)."""
    if opts.device != "cpu":
        return None
    return (f"speed numbers need a GPU: on CPU this run checks correctness of the {opts.backend} backend "
            f"over {opts.new_tokens} new tokens; its times are CPU times and say nothing about GPU decode speed")


def check_model(spec: str | None) -> None:
    """A bad MODEL argument as a CliError, before any heavy import (UnknownModelError passes through)."""
    from .bench_load import CheckpointError, check_spec

    try:
        check_spec(spec)
    except CheckpointError as err:
        raise CliError(str(err), EXIT_BAD_CHECKPOINT) from None


def cmd_bench(args) -> int:
    check_model(args.model)
    from . import bench

    tp = getattr(args, "tp", 1)
    if tp > 1:  # tensor parallel (mirage_serve.tp.cli_tp): from a shell, start the ranks under torchrun
        from .tp import cli_tp
        rc = cli_tp.launch_bench(args)
        if rc is not None:
            return rc
    opts = options(args)
    note = speed_note(opts)
    if note:
        print(note, flush=True)
    lm = _load(opts) if tp == 1 else cli_tp.load_sharded(opts, tp)
    try:
        result = bench.run(lm, opts)
    except bench.BenchOOM as err:
        raise CliError(str(err), EXIT_OOM) from None
    if tp > 1:
        cli_tp.finish(result, args, lm)
    result["environment"]["command"] = "mirage-serve " + " ".join(shlex.quote(a) for a in args.argv)
    if lm.random_weights:
        result["notes"].append("random weights: token ids are meaningless, only speed and agreement matter")
    result["speed_note"] = note  # printed first above; kept in the record and the markdown
    if not result["patch"]["available"]:
        result["notes"].append("ours was not measured: patch() is missing from this build")
    elif result["patch"]["error"]:
        result["notes"].append("ours was not measured: patch() raised (a bug: please report it)")
    elif result["patch"]["report"]:
        # The per-site table can run to hundreds of lines: its summary (last line) unless asked.
        report = result["patch"]["report"].rstrip()
        print(report if args.report else "patch report: " + report.splitlines()[-1])
        print()
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    if args.markdown:
        with open(args.markdown, "a") as fh:
            fh.write(format_markdown(result) + "\n")
    if args.plot:

        runs = [r["run"] for r in result["rows"]]
        series = {name: [next((row["tok_per_s"] for row in result["rows"]
                               if row["run"] == name and row["batch"] == b), None) for b in opts.batches]
                  for name in dict.fromkeys(runs)}
        write_plot(args.plot, opts.batches, series,
                   f"{result['model']['name']} {opts.dtype} {opts.device} tok/s")
    c = result["correctness"]
    if c["checked"] and not c["identical"] and not c.get("near_tie"):
        return EXIT_INCORRECT
    if not all(r["ok"] for r in result.get("sampling", {}).values()):
        return EXIT_INCORRECT
    if result["patch"]["available"] and result["patch"]["error"]:
        return EXIT_PATCH_FAILED
    return EXIT_OK
