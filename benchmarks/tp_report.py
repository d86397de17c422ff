"""The tensor-parallel session's markdown table (benchmarks/tp_session.py), from its result record."""
from __future__ import annotations


def capture_errors(model) -> list[str]:
    """Why a graphed decode loop fell back to eager steps, if one did (decode.fast_loop)."""
    runner = getattr(model, "_mirage_decode_runner", None)
    return sorted({lp.capture_error for lp in getattr(runner, "loops", {}).values() if lp.capture_error})


def _at(d: dict | None, b: int):
    """``d[b]``: batch keys are ints in the session, strings once read back from its JSON."""
    d = d or {}
    return d.get(b, d.get(str(b)))


def table(r: dict) -> str:
    """One markdown row per model and batch: ms/step of each run, ratios, % of the per-GPU floor."""
    env = r["environment"]
    bws = r.get("collectives", {}).get("copy_bandwidth_GBps") or []
    bw = min(bws) if bws else None
    ar = {x["bytes"]: x.get("graph_us", x["eager_us"]) for x in r.get("collectives", {}).get("allreduce", [])}
    lines = [f"TP decode, {env['device_name']} ×{r['settings']['world']}, torch {env['torch']}, transformers "
             f"{env['transformers']}, {env['date']}; copy bandwidth {bw and round(bw)} GB/s per GPU",
             "| model | b | ours TP=2 ms | our TP=1 ms | HF TP=2 static+compile ms | TP2/TP1 | × HF TP2 | "
             "% floor (per GPU) | tokens vs TP=1 |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in r.get("models", {}).items():
        for b in r["settings"]["batch"]:
            ours = _at((m.get("ours") or {}).get("ms_per_step"), b)
            tp1 = _at(((r.get("tp1") or {}).get(name) or {}).get("ms_per_step"), b)
            hf = _at((m.get("hf_static_compile") or {}).get("ms_per_step"), b)
            floor = m.get("bytes_per_gpu") / (bw * 1e9) * 1e3 if bw and m.get("bytes_per_gpu") else None
            tok = _at((m.get("ours") or {}).get("tokens_vs_tp1"), b) or {}
            tok_s = ("identical" if tok.get("identical") else
                     f"differ at step {tok['first_divergence']['step']}" + (" (near tie)" if tok.get("near_tie") else "")
                     if tok.get("checked") else "-")
            f = (lambda v: f"{v:.3f}" if v else "-")
            lines.append(f"| {name} | {b} | {f(ours)} | {f(tp1)} | {f(hf)} | "
                         f"{f(ours / tp1) if ours and tp1 else '-'} | {f(hf / ours) if ours and hf else '-'} | "
                         f"{f(100 * floor / ours) if ours and floor else '-'} | {tok_s} |")
    if ar:
        lines.append("all-reduce µs in a CUDA graph: " + ", ".join(f"{k} B {v:.1f}" for k, v in sorted(ar.items())))
    return "\n".join(lines)


if __name__ == "__main__":  # python benchmarks/tp_report.py tp_session.json: the table again
    import json
    import sys

    print(table(json.load(open(sys.argv[1]))))
