"""`mirage-serve bench`: end-to-end decode speed of a patched model against HF baselines, same process.

Order of work (so every number comes from one process and one set of weights):
  1. load the model (random weights for registry names), measure copy bandwidth (GPU);
  2. per batch: time each baseline on the unpatched model — `static-compile` is HF's static cache with
     its automatic torch.compile; `eager` (HF dynamic cache) always runs, its greedy tokens are the
     correctness reference, and it is timed only when it is a requested baseline;
  3. patch() once (timed), time ours per batch with plain generate() (the patch owns caches and graphs),
     compare its greedy tokens with eager's, unpatch(); then patch again over the kernel cache the
     first patch filled and time it up to the end of a first decode step (the warm-cache cost).
Decode-step time, floor and units: see bench_timing and registry.decode_bytes.
"""
from __future__ import annotations

import dataclasses
import datetime
import platform
import statistics
import sys
import time
from typing import Any

from . import bench_sampling, registry
from .cache import default_cache_dir
from .bench_load import LoadedModel
from .bench_timing import Progress, decode_step_time, first_divergence, generate

SCHEMA = "mirage-serve.bench/1"
BASELINES = {"eager": "dynamic", "static-compile": "static"}  # run name -> generate() cache mode


class BenchOOM(RuntimeError):
    """The GPU ran out of memory at `batch`; `largest_fit` is the largest batch that did fit (or None)."""

    def __init__(self, batch: int, largest_fit: int | None):
        self.batch, self.largest_fit = batch, largest_fit
        fit = f"the largest batch that fits is {largest_fit}" if largest_fit else "not even batch 1 fits"
        super().__init__(f"out of GPU memory at batch {batch}; {fit} (try --batch {largest_fit or 1} "
                         "or --layers N)")


@dataclasses.dataclass
class BenchOptions:
    model: str | None
    batches: list[int]
    prompt_len: int
    new_tokens: int
    dtype: str
    baselines: list[str]
    backend: str
    device: str
    layers: int | None = None
    overrides: dict = dataclasses.field(default_factory=dict)
    repeats: int = 3
    seed: int = 0
    cache_dir: str | None = None  # patch()'s kernel cache (None: its default)
    graphs: bool = True  # False: patch(cuda_graphs=False), the kernels alone under HF's decode loop


def _prompt(batch: int, length: int, vocab: int, seed: int, device: str):
    """Random prompt ids [batch, length], the same for every run at this batch size."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed + batch)
    return torch.randint(3, vocab, (batch, length), generator=gen).to(device)


def _is_oom(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.cuda.OutOfMemoryError)


def _largest_fit(model, opts: BenchOptions, failed: int, done: list[int]) -> int | None:
    """Largest batch known to fit: the largest one finished, else halve until a 2-token generate fits."""
    import torch

    if done:
        return max(done)
    b = failed // 2
    while b >= 1:
        torch.cuda.empty_cache()
        try:
            generate(model, _prompt(b, opts.prompt_len, model.config.vocab_size, opts.seed, opts.device),
                     2, "dynamic")
            return b
        except torch.cuda.OutOfMemoryError:
            b //= 2
    return None


def _measure(lm: LoadedModel, opts: BenchOptions, cache: str, prog: Progress, timed: bool = True):
    """{batch: (seconds per step, tokens [B, N], first divergence between its timed runs or None, warm-up
    seconds or None)} for one run over all batch sizes (ascending).

    ``timed=False``: one generate() a batch, seconds None — eager's reference tokens when eager is not
    a requested baseline (timing it cost a warm-up and 3 repeats for a row not shown: ~100 s a model
    at 256 tokens on Gemma-3-1B).

    Out of memory at batch b: BenchOOM with the largest batch this same run finished (memory
    differs between runs: the static cache and the patch hold more), else a probed one.
    """
    out: dict[int, tuple] = {}
    for b in opts.batches:
        ids = _prompt(b, opts.prompt_len, lm.model.config.vocab_size, opts.seed, opts.device)
        try:
            if timed:
                runs: list = []
                warm: list = []
                steps: list = []
                sec, tokens = decode_step_time(lm.model, ids, opts.new_tokens, cache, opts.device, opts.repeats,
                                               prog, every_run=runs, warmup=warm, each_step=steps)
                out[b] = (sec, tokens, _repeat_divergence(runs), warm[0] if warm else None, steps)
            else:
                out[b] = (None, generate(lm.model, ids, opts.new_tokens, cache), None, None, [])
                prog.step("reference tokens")
        except Exception as err:
            if not _is_oom(err):
                raise
            import torch

            del err
            torch.cuda.empty_cache()
            raise BenchOOM(b, _largest_fit(lm.model, opts, b, list(out))) from None
    return out


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": device,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": None}  # filled in by the CLI, which knows its argv
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.startswith("cuda"):
        env["device_name"] = torch.cuda.get_device_name()
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


def _repeat_divergence(runs: list) -> dict | None:
    """Where the timed runs of one prompt first disagree with the first run (None: all the same).
    Greedy decoding repeats itself only where every kernel gives the same bits on every launch; a
    sum whose order changes from launch to launch (atomic adds across blocks) can flip a near-tied
    token, and then everything after it."""
    first = runs[0].cpu() if runs else None
    return next((d for t in runs[1:] if (d := first_divergence(first, t.cpu())) is not None), None)


def _repeats(opts: BenchOptions, measured: dict) -> dict:
    """{run: {batch: first divergence between its timed runs or None}} for every timed run."""
    return {name: {str(b): per_batch[b][2] for b in opts.batches}
            for name, per_batch in measured.items() if any(v[0] is not None for v in per_batch.values())}


def run(lm: LoadedModel, opts: BenchOptions) -> dict[str, Any]:
    """Measure everything and return the result record (the --json document; see SCHEMA)."""
    import torch

    torch.manual_seed(opts.seed)
    facts = lm.facts
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "model": {"spec": opts.model, "name": lm.name, "source": lm.source,
                  "random_weights": lm.random_weights, "model_type": facts.get("model_type"),
                  "num_hidden_layers": facts.get("num_hidden_layers"), "params": registry.param_count(facts),
                  "decode_bytes": registry.decode_bytes(facts, opts.dtype)},
        "settings": {k: getattr(opts, k) for k in ("batches", "prompt_len", "new_tokens", "dtype",
                                                  "baselines", "backend", "device", "repeats", "seed", "graphs")}
        | {"cache_dir": str(default_cache_dir(opts.cache_dir))},  # the user cache patch() fills
        "environment": environment(opts.device),
        "notes": [],
    }
    bw_before = _copy_bandwidth(opts.device)
    timed = list(opts.baselines)
    caches = [BASELINES[name] for name in timed] + ["default"]  # "default": ours, the patch's caches
    # One progress step per timed repetition, plus one for the warm-up decode_step_time does, plus one
    # per batch for eager's reference tokens when eager is not also a timed baseline.
    warm = [opts.device.startswith("cuda") or cache == "static" for cache in caches]
    prog = Progress("bench", sum(len(opts.batches) * (w + opts.repeats) for w in warm)
                    + (0 if "eager" in timed else len(opts.batches)))
    measured: dict[str, dict] = {}
    if "eager" not in timed:  # its tokens alone, the correctness reference
        measured["eager"] = _measure(lm, opts, BASELINES["eager"], prog, timed=False)
    for name in timed:
        measured[name] = _measure(lm, opts, BASELINES[name], prog)
    sampled = {b: bench_sampling.sample(lm.model, ids, _sampling_steps(opts), opts.seed, True)
               for b, ids in _sampling_prompts(lm, opts).items()}
    references = _sampling_references(lm, opts, sampled, result["notes"])
    result["patch"] = _patch_and_measure(lm, opts, measured, prog, sampled, references)
    result["sampling"] = result["patch"].pop("sampling", {})
    # the floor from the better of two copy measurements, before and after the timed runs: one alone read 14% low
    # on a machine that had just run other work (session 34: 2497 GB/s where the runs around it read 2873-2931)
    samples = [b for b in (bw_before, _copy_bandwidth(opts.device)) if b]
    bw = max(samples, default=None)
    result["copy_bandwidth_GBps"] = bw / 1e9 if bw else None
    result["copy_bandwidth_samples_GBps"] = [b / 1e9 for b in samples]
    result["floor_ms"] = result["model"]["decode_bytes"] / bw * 1e3 if bw else None
    result["rows"] = _rows(opts, measured, result["floor_ms"])
    result["correctness"] = _correctness(opts, measured)
    result["repeats"] = _repeats(opts, measured)
    if result["correctness"]["first_divergence"]:
        first = result["correctness"]["first_divergence"]
        result["correctness"].update(_tie_check(lm.model, opts, measured, first))
    return result


def _sampling_steps(opts: BenchOptions) -> int:
    return min(bench_sampling.STEPS, max(2, opts.new_tokens))


def _sampling_prompts(lm: LoadedModel, opts: BenchOptions) -> dict:
    return {b: _prompt(b, opts.prompt_len, lm.model.config.vocab_size, opts.seed, opts.device)
            for b in opts.batches}


def _sampling_references(lm: LoadedModel, opts: BenchOptions, eager: dict, notes: list) -> dict:
    """bench_sampling.reference per batch: eager's sampled tokens through the (still unpatched)
    model widened to float32; {} with a note where the widened model does not fit."""
    import torch

    try:
        return {b: bench_sampling.reference(lm.model, ids, eager[b][0])
                for b, ids in _sampling_prompts(lm, opts).items()}
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        notes.append("sampling: no float32 reference (the model widened to float32 did not fit); "
                     "the patched logits are compared with eager's alone")
        return {}
    except Exception as e:  # a model the widening cannot run: the timing result still stands, said so
        notes.append(f"sampling: no float32 reference ({type(e).__name__}: {str(e)[:200]}); "
                     "the patched logits are compared with eager's alone")
        return {}


def _sampling_check(lm: LoadedModel, opts: BenchOptions, eager: dict, references: dict) -> dict:
    """bench_sampling.compare per batch, on the patched model, against eager's samples ``eager``
    and the float32 ``references`` of them (bench_sampling.reference; a batch without one is
    compared with eager alone)."""
    from .patching.prepare import tolerance

    param = next(lm.model.parameters())
    tol = tolerance(param.dtype, param.is_cuda) or 1e-2
    out = {}
    for b, ids in _sampling_prompts(lm, opts).items():
        steps = eager[b][0].shape[1]
        got = bench_sampling.sample(lm.model, ids, steps, opts.seed, True)
        fast, _ = bench_sampling.sample(lm.model, ids, steps, opts.seed, False)
        out[b] = bench_sampling.compare(eager[b], got, fast, tol, references.get(b))
    return out


def _patch_and_measure(lm: LoadedModel, opts: BenchOptions, measured: dict, prog: Progress,
                       sampled: dict, references: dict) -> dict:
    """Patch (timed), measure ours into `measured["ours"]`, check sampling against eager's
    ``sampled`` and their float32 ``references``, unpatch; returns the "patch" record (its
    "sampling" entry: bench_sampling)."""
    from .patching.pipeline import patch, unpatch  # torch and transformers: loaded when a bench runs

    print(f"patching {lm.name} (backend {opts.backend}, buckets {opts.batches}) ...", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    try:
        report = patch(lm.model, backend=opts.backend, batch_sizes=tuple(opts.batches),
                       cache_dir=opts.cache_dir, **_graphs(opts))
    except Exception as err:  # keep the baselines measured so far; the CLI reports the failure
        if _is_oom(err):
            raise
        return {"available": True, "seconds": None, "report": None, "error": f"{type(err).__name__}: {err}"}
    seconds = time.perf_counter() - t0
    try:
        # kernels alone: HF's loop on a static cache (where the decode-attention kernels run), with
        # HF's auto-compile off (it would trace around them)
        measured["ours"] = _measure(lm, opts, "default" if opts.graphs else "static-eager", prog)
        paths = _decode_paths(lm.model)
        attention, kernels = _attention_verdicts(lm.model), _attention_kernels(lm.model)
        sampling = _sampling_check(lm, opts, sampled, references)
    finally:
        unpatch(lm.model)
    return {"available": True, "seconds": seconds, "report": str(report), "error": None,
            "counts": _counts(report), "decode_paths": paths, "decode_attention": attention,
            "attention_kernels": kernels,
            "sampling": sampling, "warm": _warm_repatch(lm, opts, patch, unpatch)}


def _graphs(opts: BenchOptions) -> dict:
    return {} if opts.graphs else {"cuda_graphs": False}  # default: patch() decides (on for CUDA)


def _counts(report) -> dict:
    return {k: getattr(report, k, None) for k in ("searches", "reinstantiated", "compiles", "cache_hits", "programs")}


def _attention_kernels(model) -> dict:
    """What the attention modules' last decode step ran and why -> how many modules (searched or
    hand-written, with both times where the GPU profile chose: ``attention_searched.AttentionSearch.decide``)."""
    from collections import Counter

    from .decode.attention_fast import attention_kernels
    return dict(Counter(attention_kernels(model).values()))


def _attention_verdicts(model) -> dict:
    """First-use verdict -> attention modules with it ("ok": they ran our decode-attention kernels)."""
    from collections import Counter

    from .decode.attention_fast import attention_verdicts
    return dict(Counter(attention_verdicts(model).values()))


def _copy_bandwidth(device: str) -> float | None:
    """The GPU's copy bandwidth in bytes/s (``superopt.runtime.timing``); None off GPU: a CPU memcpy
    says nothing about the GPU floor the table compares against."""
    if not device.startswith("cuda"):
        return None
    from superopt.runtime.timing import copy_bandwidth

    return copy_bandwidth(device=device)


def _decode_paths(model) -> dict:
    from .decode import decode_paths

    return decode_paths(model)


def _warm_repatch(lm: LoadedModel, opts: BenchOptions, patch, unpatch) -> dict:
    """Patch again over the cache the first patch filled, then one generate() of 2 new tokens: the
    cost a user pays when the kernel cache is warm (searches and compiles should be 0)."""
    import torch

    ids = _prompt(opts.batches[0], opts.prompt_len, lm.model.config.vocab_size, opts.seed, opts.device)
    t0 = time.perf_counter()
    report = patch(lm.model, backend=opts.backend, batch_sizes=tuple(opts.batches), cache_dir=opts.cache_dir,
                   **_graphs(opts))
    patched = time.perf_counter() - t0
    try:
        with torch.inference_mode():
            lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                              do_sample=False, pad_token_id=0)
        if opts.device.startswith("cuda"):
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
    finally:
        unpatch(lm.model)
    return {"patch_seconds": patched, "first_step_seconds": first, "counts": _counts(report)}


def spread_pct(steps: list[float]) -> float | None:
    """(max − min) / median of step times (a run's repetitions; benchmarks/ab_trees.py: whole runs), in %; None
    below two of them or where the median is not positive."""
    if len(steps) < 2:
        return None
    mid = statistics.median(steps)
    return 100 * (max(steps) - min(steps)) / mid if mid > 0 else None


def _rows(opts: BenchOptions, measured: dict, floor_ms: float | None) -> list[dict]:
    rows = []
    order = (["ours"] if "ours" in measured else []) + [r for r in measured if r != "ours"]
    for b in opts.batches:
        for name in order:
            if name != "ours" and name not in opts.baselines:
                continue  # eager ran only as the correctness reference
            sec = measured[name][b][0]
            ms = sec * 1e3
            row = {"batch": b, "run": name, "ms_per_step": ms, "tok_per_s": b / sec if sec > 0 else None,
                   "pct_of_floor": 100 * floor_ms / ms if floor_ms and ms > 0 else None, "speedup": {},
                   # the first generate()s at this batch: HF's compile; our first-use checks, attention choice
                   # and CUDA-graph captures
                   "warmup_seconds": measured[name][b][3],
                   # each repetition's own step time, and their spread: how far the median can be trusted
                   "ms_per_step_runs": [s * 1e3 for s in measured[name][b][4]],
                   "spread_pct": spread_pct(measured[name][b][4])}
            if name == "ours":
                for base in opts.baselines:
                    base_ms = measured[base][b][0] * 1e3
                    row["speedup"][base] = base_ms / ms if ms > 0 else None
            rows.append(row)
    return rows


def _correctness(opts: BenchOptions, measured: dict) -> dict:
    if "ours" not in measured:
        return {"reference": "eager", "checked": False, "identical": None, "steps": opts.new_tokens,
                "first_divergence": None}
    per_batch = {}
    for b in opts.batches:
        per_batch[b] = first_divergence(measured["eager"][b][1].cpu(), measured["ours"][b][1].cpu())
    first = next(({"batch": b, **d} for b, d in per_batch.items() if d is not None), None)
    return {"reference": "eager", "checked": True, "identical": first is None, "steps": opts.new_tokens,
            "first_divergence": first}


TIE_ULPS = 2  # a divergence whose eager logit gap is within this many ulps of the top logit is a tie


def _tie_check(model, opts: BenchOptions, measured: dict, d: dict) -> dict:
    """Was the first divergence a near-tie? Re-run the unpatched model on the prompt + eager's tokens
    before the divergent step and compare the logits of the two competing tokens.

    Random weights give flat logits, so in bf16 two tokens often differ by less than the rounding of
    any reordered sum; docs/conventions.md sets greedy agreement "ties aside". Tolerance: TIE_ULPS units
    in the last place of the largest logit, in the model's dtype; past it, the step is re-scored in
    float32 (``_float32_rescore``).
    """
    import torch

    b, row, step = d["batch"], d["row"], d["step"]
    ref = measured["eager"][b][1]  # [B, N]
    prompt = _prompt(b, opts.prompt_len, model.config.vocab_size, opts.seed, opts.device)[row:row + 1]
    seq = torch.cat([prompt, ref[row:row + 1, :step].to(prompt.device)], dim=1)  # [1, P + step]
    with torch.inference_mode():
        logits = model(seq).logits[0, -1].float()  # [V]
    gap = float(logits[d["expected"]] - logits[d["got"]])
    eps = torch.finfo(next(model.parameters()).dtype).eps
    tol = TIE_ULPS * eps * float(logits.abs().max())
    out = {"logit_gap": gap, "tie_tolerance": tol, "near_tie": abs(gap) <= tol}
    if not out["near_tie"]:
        tokens = ref[row:row + 1, :step + 1].to(prompt.device)  # through the divergent step's expected token
        out.update(_float32_rescore(model, prompt, tokens, d, gap, tol))
    return out


def _float32_rescore(model, prompt, tokens, d: dict, gap: float, tol: float) -> dict:
    """The divergent step scored by the unpatched model in float32 (``bench_sampling.reference``, the
    sampling check's reference): a near-tie when float32 separates the two tokens by no more than
    eager's own bf16 error on that gap, plus the ulps of ``TIE_ULPS``. Eager's bf16 order of the
    pair is then noise of the model's dtype, and a patched run that orders it the other way is no
    less right (Gemma's bf16 logits sit 1.7-1.9e-2 from float32's, eager and ours alike; seven times
    Llama's)."""
    wide = bench_sampling.reference(model, prompt, tokens)[0, -1]  # [V] float32, the logits of token `step`
    gap32 = float(wide[d["expected"]] - wide[d["got"]])
    error = abs(gap - gap32)
    return {"float32_gap": gap32, "eager_error": error, "near_tie": gap32 <= error + tol}
