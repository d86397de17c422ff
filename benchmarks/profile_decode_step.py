"""Where one decode step's time goes: per-kernel GPU time, kernels per step, idle gaps, achieved bandwidth.

Patches a registry model (random weights), warms generate() up so the decode graphs are captured, then
profiles `--steps` decode steps with torch.profiler (CUPTI sees the kernels inside CUDA-graph replays)
and prints, per kernel name: launches per step, µs per step, share of the step; then GPU-busy µs per
step, idle gap µs per step (step wall − busy), and weight bytes ÷ busy time as % of the copy bandwidth
measured in the same run; then, per site program, µs per call and its weights ÷ that time (achieved
bandwidth per block; library kernels such as cuBLAS GEMVs are not attributed to a site).
On sm_90+ the generated kernels use programmatic dependent launch: a kernel's span then starts while
its predecessor still runs (it waits in ``griddepcontrol.wait``), so its span includes that wait (the busy
total counts overlaps once). The marginal column (``marginal``: a launch's end minus the end before it) is
what each launch added to the step, and sums to it; the site table uses it.

    python benchmarks/profile_decode_step.py Llama-3.1-8B --batch 1 --steps 32 [--no-patch]
    python benchmarks/profile_decode_step.py Llama-3.1-8B --attention hand-written,searched   # issue 28, must-show 3
    python benchmarks/profile_decode_step.py Llama-3.2-1B --from-trace trace.json.gz          # a --trace-out, no GPU

``--attention``: one profile per ``PatchOptions.attention`` mode, in one process (the model loaded once,
patched, profiled and unpatched per mode), each with the decode-attention kernels' own rows summed
(the searched μGraph's kernels ``decode_attention_*``, the hand-written ``_attend_split`` / ``_combine``)
and what ``mirage_serve.attention_kernels`` says each layer ran.
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from dataclasses import dataclass


COPIES = ("Memcpy", "Memset")  # CUPTI's names for copies and fills: not launches of a kernel


@dataclass(frozen=True)
class KernelSpan:
    name: str
    start_us: float
    end_us: float


def summarize(spans: list[KernelSpan], steps: int) -> dict:
    """Aggregate kernel spans recorded over ``steps`` decode steps (per-step figures)."""
    spans = sorted(spans, key=lambda s: s.start_us)
    per_name: dict[str, list[float]] = defaultdict(list)
    busy, cursor = 0.0, float("-inf")
    for s in spans:  # union of intervals: overlapping kernels count once
        per_name[s.name].append(s.end_us - s.start_us)
        lo = max(s.start_us, cursor)
        if s.end_us > lo:
            busy += s.end_us - lo
        cursor = max(cursor, s.end_us)
    wall = (spans[-1].end_us - spans[0].start_us) if spans else 0.0
    rows = sorted(((n, len(d) / steps, sum(d) / steps) for n, d in per_name.items()), key=lambda r: -r[2])
    return {"rows": rows, "busy_us": busy / steps, "wall_us": wall / steps,
            "gap_us": (wall - busy) / steps, "kernels_per_step": len(spans) / steps}


def marginal(spans: list[KernelSpan], steps: int) -> list[tuple[str, float, float, float]]:
    """Per kernel name: (name, launches/step, marginal µs/step, µs each launch started before the previous end).

    A kernel's marginal time is its end minus the latest end before it (0 where it ends inside an earlier
    kernel): the time the step got longer because it ran, its launch gap and its wait included, so the rows add
    up to the step's span. Under dependent launch the span of a kernel (``summarize``'s rows) starts while its
    predecessor runs and counts that overlap, which makes the per-kernel spans add up to far more than the
    step (session 36: attn_in 243 µs a step in spans, 93 µs marginal, at Llama-3.2-1B b1); the marginal view
    is the one to read a launch's cost from. The last column is how far ahead of that previous end the launch
    began (negative: a gap before it)."""
    spans = sorted(spans, key=lambda s: s.start_us)
    per_name: dict[str, list[tuple[float, float]]] = defaultdict(list)
    last_end = spans[0].start_us if spans else 0.0
    for s in spans:
        per_name[s.name].append((max(0.0, s.end_us - last_end), last_end - s.start_us))
        last_end = max(last_end, s.end_us)
    rows = [(n, len(v) / steps, sum(m for m, _ in v) / steps, sum(e for _, e in v) / len(v))
            for n, v in per_name.items()]
    return sorted(rows, key=lambda r: -r[2])


def rare_kernels(spans: list[KernelSpan], steps: int) -> set[str]:
    """Kernel names that ran fewer than ``steps`` times: none of them can be part of every decode step
    (the loop's poll of its finished rows, once every 16 steps; a kernel only the prefill runs)."""
    counts = Counter(s.name for s in spans)
    return {name for name, n in counts.items() if n < steps}


def decode_steps(spans: list[KernelSpan], steps: int, min_period: int = 1) -> tuple[list[KernelSpan], bool]:
    """The last ``steps`` decode steps of a profiled ``generate()`` and whether they were found
    exactly. A CUDA-graph replay launches the same kernels in the same order every step, so a step
    is the shortest ``p`` with which ``steps × p`` kernel names repeat, ending at most a step's worth
    of kernels before the end: what comes before is the prefill (HF's own path: another kernel
    count) and the warm step, what comes after is generate()'s own epilogue (the output's concat).
    Two things are set aside first: the ``rare_kernels``, which would break the repetition where they
    fall between two steps, and periods under ``min_period`` (pass the layer count: a step runs every
    layer, so a shorter period is one layer's kernels repeating inside a step whose layers outnumber
    ``steps``). Where no such run exists (an eager baseline), 1/(steps+1) of the kernels is dropped as
    the prefill (approximate)."""
    rare = rare_kernels(spans, steps)
    spans = [s for s in spans if s.name not in rare]
    names = [s.name for s in spans]
    n = len(names)
    for cut in range(n // (steps + 1) + 1):
        end = n - cut
        for p in range(max(1, min_period), end // steps + 1):
            tail = names[end - steps * p:end]
            if all(tail[i] == tail[i + p] for i in range(len(tail) - p)):
                return spans[end - steps * p:end], True
    return spans[n - round(n * steps / (steps + 1)):], False


def period_break(names: list[str], steps: int) -> str:
    """Why ``decode_steps`` found no exact steps: for the period whose repeating tail is longest,
    how many whole periods repeat and the first pair of kernels (from the end) that differ."""
    best = (0, 0, -1)  # (repeating kernels, period, index of the first mismatch from the end)
    for p in range(1, len(names) // steps + 1):
        i = len(names) - 1 - p
        while i >= 0 and names[i] == names[i + p]:
            i -= 1
        best = max(best, (len(names) - 1 - p - i, p, i))
    run, p, i = best
    if i < 0:
        return f"period {p}: the whole trace repeats"
    return (f"longest repeating tail: {run + p} kernels at a period of {p} ({(run + p) / p:.1f} periods); it breaks at "
            f"kernel {i} of {len(names)}: {names[i][:60]!r} where {p} later comes {names[i + p][:60]!r}")


def site_bandwidth(rows: list[tuple[str, float, float]], part_bytes: dict[str, int],
                   twins: dict[str, int] | None = None, folds: dict[str, tuple[str, int]] | None = None) -> list[tuple]:
    """Per site program (``sites.site_parts`` label): (label, calls/step, µs per call, bytes per call,
    GB/s). ``rows``: ``summarize``'s (kernel name, launches/step, µs/step); a program's kernels are
    named ``<label>_m<rows>_fused_k<i>`` and its first kernel (``k0``) counts the calls; bytes per
    call: the program's parameters (its weights), which a decode GEMV reads once per call.
    ``twins``: label -> launches per step of a program two parts of every layer run (k and v) when
    they run apart; launched half as often, it ran as one paired launch reading both parts'
    weights (``mirage_serve.patching.pairing``), and is listed as ``<label> ×2``.
    ``folds``: label -> (the first label of its site, the bytes it adds there). A part that launched nothing of its
    own while its site's first part did was stacked into that launch (``PatchOptions.stacked_projections``: q, k and
    v as one projection), whose bytes then include it; the row is listed as ``<first> +<label>``. Session 33's
    profiles, made without this, counted q's weights alone for the stacked q/k/v launch."""
    import re

    def launches(label: str) -> list[tuple[str, float, float]]:
        pat = re.compile(rf"^{re.escape(label)}_m\d+_fused_k(\d+)$")
        return [(m.group(1), n, us) for name, n, us in rows if (m := pat.match(name))]

    stacked: dict[str, list[tuple[str, int]]] = {}
    for label, (first, extra) in (folds or {}).items():
        if not launches(label) and launches(first):
            stacked.setdefault(first, []).append((label, extra))
    out = []
    for label, nbytes in part_bytes.items():
        hits = launches(label)
        calls = sum(n for k, n, _ in hits if k == "0")
        if calls:
            us = sum(u for _, _, u in hits) / calls
            if twins and label in twins and round(2 * calls) == twins[label]:
                label, nbytes = f"{label} ×2", 2 * nbytes
            for other, extra in stacked.get(label, []):
                label, nbytes = f"{label} +{other}", nbytes + extra
            out.append((label, calls, us, nbytes, nbytes / (us * 1e-6) / 1e9))
    return sorted(out, key=lambda r: -r[1] * r[2])


def _part_bytes(model) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[str, int]]]:
    """Parameter bytes of each site program of the model's first decoder layer; for each program two parts of a
    layer run (k and v), its launches per step when they run apart; and for each later part of a site, the site's
    first part and the bytes of their parameters that part lacks, summed over the parts of that label
    (``site_bandwidth``'s ``folds``). Sites as patch() finds them: the family's adapter, else the partition of the traced layer (call
    before patching)."""
    from mirage_serve.patching.pipeline import family_of
    from mirage_serve.patching.sites import find_layers, site_module, site_parts

    family, _ = family_of(model, model.config.model_type)
    _, layers = find_layers(model, family)
    out, count, folds = {}, defaultdict(int), {}
    for site in family.sites:
        parts = site_parts(site.name, site_module(layers[0], site))
        first = {id(p) for p in parts[0][1].parameters()} if parts else set()
        for label, part, _ in parts:
            out[label] = sum(p.numel() * p.element_size() for p in part.parameters())
            count[label] += 1
            extra = sum(p.numel() * p.element_size() for p in part.parameters() if id(p) not in first)
            if label != parts[0][0] and extra:  # (a norm part's weight is the first part's too)
                folds[label] = (parts[0][0], folds.get(label, (None, 0))[1] + extra)  # k and v: one label
    return out, {label: 2 * len(layers) for label, c in count.items() if c == 2}, folds


def _profile(model, ids, steps: int) -> list[KernelSpan]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    kw = dict(max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    with torch.inference_mode():
        model.generate(ids, **kw)  # warm-up: capture the decode graphs
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model.generate(ids, **kw)
            torch.cuda.synchronize()
    # kernels only: the loop's poll of its finished flags is a device-to-host copy every few steps
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith(COPIES)),
                     key=lambda e: e.time_range.start)
    return [KernelSpan(e.name, e.time_range.start, e.time_range.end) for e in kernels]  # prefill too


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--no-patch", dest="patch", action="store_false")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--attention", default="", help="comma-separated PatchOptions.attention modes, one profile each")
    ap.add_argument("--trace-out", default="", help="write every profiled kernel (name, start µs, end µs) as JSON here")
    ap.add_argument("--from-trace", default="", help="no GPU: the tables of a --trace-out file (.json or .json.gz); "
                                                      "MODEL gives the layer count")
    args = ap.parse_args(argv)
    if args.from_trace:
        return _from_trace(args)
    import torch

    from mirage_serve.bench_load import load
    from superopt.runtime.timing import copy_bandwidth

    bw = copy_bandwidth()
    lm = load(args.model, dtype="bf16", device="cuda")
    part_bytes = _part_bytes(lm.model) if args.patch else None
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(1, lm.facts["vocab_size"], (args.batch, args.prompt_len), device="cuda", generator=g)
    if not args.patch:
        from mirage_serve.decode import install_decode_graphs

        install_decode_graphs(lm.model)
        return _report(args, lm, ids, bw, None)
    import mirage_serve
    from mirage_serve.options import PatchOptions

    for mode in args.attention.split(",") if args.attention else [None]:
        options = PatchOptions(attention=mode) if mode else None
        print(f"\n===== attention: {mode or 'default'}")
        print(mirage_serve.patch(lm.model, batch_sizes=(args.batch,), options=options))
        _report(args, lm, ids, bw, part_bytes)
        mirage_serve.unpatch(lm.model)


ATTENTION_KERNELS = ("decode_attention_", "_attend_split", "_combine")


def _from_trace(args) -> None:
    import gzip
    import json

    from mirage_serve import registry

    opener = gzip.open if args.from_trace.endswith(".gz") else open
    with opener(args.from_trace, "rt") as f:
        trace = [KernelSpan(*t) for t in json.load(f)]
    print_tables(trace, args.steps, registry.get(args.model).config["num_hidden_layers"], args.top,
                 f"{args.from_trace}: {args.model} batch {args.batch}")


def print_tables(trace: list[KernelSpan], steps: int, layers: int, top: int, title: str) -> tuple[dict, list]:
    """The step tables of a profiled ``generate()``'s kernels: per kernel, its spans (``summarize``) and its
    marginal time (``marginal``). Returns both summaries."""
    spans, exact = decode_steps(trace, steps, min_period=layers)
    rare = rare_kernels(trace, steps)
    print(f"set aside: {sum(t.name in rare for t in trace)} launches of {len(rare)} kernels that ran fewer than "
          f"{steps} times (not every step: the prefill's, the loop's poll of its finished rows)")
    if not exact:
        print("decode steps not found exactly: " + period_break([t.name for t in trace], steps))
    s = summarize(spans, steps)
    print(f"{title}; {s['kernels_per_step']:.0f} kernels/step, GPU busy {s['busy_us']:.0f} µs/step, idle gaps "
          f"{s['gap_us']:.0f} µs/step, span {s['wall_us']:.0f} µs/step"
          + ("" if exact else " (steps not repeating: prefill cut approximately)"))
    rows = marginal(spans, steps)
    marg = {n: (us, early) for n, _, us, early in rows}
    print(f"{'kernel':<62} {'per step':>8} {'span µs':>9} {'marginal':>9} {'share':>6} {'early µs':>9}")
    for name, n, us in sorted(s["rows"], key=lambda r: -marg[r[0]][0])[:top]:
        m, early = marg[name]
        print(f"{name[:62]:<62} {n:>8.1f} {us:>9.1f} {m:>9.1f} {100 * m / s['wall_us']:>5.1f}% {early:>9.2f}")
    print("(span: each launch's own start to end, which under dependent launch includes its wait; marginal: "
          "its end minus the end before it, summing to the step; early: how long before that end it began)")
    return s, rows


def _report(args, lm, ids, bw, part_bytes) -> None:
    """Profile ``args.steps`` decode steps of the (patched) model and print the tables."""
    import torch

    from mirage_serve import registry

    trace = _profile(lm.model, ids, args.steps)
    if args.trace_out:
        import json

        with open(args.trace_out, "w") as f:
            json.dump([[t.name, t.start_us, t.end_us] for t in trace], f)
    s, marg = print_tables(trace, args.steps, lm.facts["num_hidden_layers"], args.top,
                           f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s; {lm.name} batch {args.batch}")
    floor_bytes = registry.decode_bytes(lm.facts)
    print(f"weights {floor_bytes / 1e9:.2f} GB/step → {floor_bytes / (s['busy_us'] * 1e-6) / 1e9:.0f} GB/s over "
          f"busy time = {100 * floor_bytes / (s['busy_us'] * 1e-6) / bw:.0f}% of copy bandwidth")
    if part_bytes is not None:
        from mirage_serve import attention_kernels

        attn = [(n, c, us) for n, c, us, _ in marg if n.startswith(ATTENTION_KERNELS)]
        print(f"decode-attention kernels: {sum(c for _, c, _ in attn):.0f} launches/step, "
              f"{sum(us for _, _, us in attn):.1f} marginal µs/step ({', '.join(f'{n} {us:.1f}' for n, _, us in attn)})")
        for why, n in Counter(attention_kernels(lm.model).values()).items():
            print(f"  {n} layers: {why}")
        print(f"\n{'site program':<20} {'calls/step':>10} {'µs/call':>8} {'MB/call':>8} {'GB/s':>7} {'% copy':>7}"
              "   (marginal µs: from the end of the launch before)")
        for label, calls, us, nbytes, gbps in site_bandwidth([r[:3] for r in marg], *part_bytes):
            print(f"{label:<20} {calls:>10.1f} {us:>8.1f} {nbytes / 1e6:>8.2f} {gbps:>7.0f} {100 * gbps * 1e9 / bw:>6.0f}%")


if __name__ == "__main__":
    main()
