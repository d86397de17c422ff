"""`mirage-serve bench` on a tiny random Llama (CPU): the table, the --json schema, the --plot PNG,
the correctness line when ours diverges, and the out-of-memory report."""
from __future__ import annotations

import importlib.util
import json

import pytest

from mirage_serve import bench
from mirage_serve import cli_errors as E
from mirage_serve.cli import main

from .conftest import TINY_SET, tiny_bench_args
from .test_cli_plot import png_text

ROW_KEYS = {"batch": int, "run": str, "ms_per_step": float, "tok_per_s": float, "speedup": dict}


def check_schema(doc: dict, batches: list[int], baselines: list[str], real_patch: bool = True) -> None:
    assert doc["schema"] == bench.SCHEMA
    m = doc["model"]
    assert isinstance(m["params"], int) and m["params"] > 0 and isinstance(m["decode_bytes"], int)
    assert isinstance(m["random_weights"], bool) and m["model_type"] == "llama"
    s = doc["settings"]
    assert s["batches"] == batches and s["baselines"] == baselines and s["new_tokens"] >= 2
    for key in ("python", "torch", "transformers", "device", "device_name", "date"):
        assert doc["environment"][key], key
    ours = doc["patch"]["available"] and not doc["patch"]["error"]
    extra = {"counts", "decode_paths", "decode_attention", "attention_kernels", "warm"} if ours else set()
    assert set(doc["patch"]) == {"available", "seconds", "report", "error"} | extra
    if ours and real_patch:  # a stand-in patch (real_patch=False) fills no cache
        warm = doc["patch"]["warm"]
        assert warm["counts"]["searches"] == 0 and warm["counts"]["cache_hits"] > 0, warm  # the cache was filled
        assert 0 < warm["patch_seconds"] <= warm["first_step_seconds"]
    runs = (["ours"] if ours else []) + baselines
    assert [(r["batch"], r["run"]) for r in doc["rows"]] == [(b, r) for b in batches for r in runs]
    for row in doc["rows"]:
        for key, typ in ROW_KEYS.items():
            assert isinstance(row[key], typ), (key, row)
        assert row["ms_per_step"] > 0 and row["tok_per_s"] == pytest.approx(row["batch"] * 1e3 / row["ms_per_step"])
        assert set(row["speedup"]) == (set(baselines) if row["run"] == "ours" else set())
        assert row["warmup_seconds"] is None or row["warmup_seconds"] > 0, row  # CPU eager has no warm-up
        # each repetition's own step time, and their spread (None where the median step is not positive: CPU noise)
        assert len(row["ms_per_step_runs"]) == s["repeats"], row
        assert row["spread_pct"] is None or row["spread_pct"] >= 0, row
    c = doc["correctness"]
    assert c["reference"] == "eager" and c["steps"] == s["new_tokens"]
    if ours:  # sampling checked per batch (keys become strings in JSON)
        assert set(doc["sampling"]) == {str(b) for b in batches}
        for r in doc["sampling"].values():
            assert r["ok"] and r["worst"]["rel"] <= r["tolerance"] and r["steps_compared"] >= 2, r
            assert r["first_decode_step"]["step"] == 1
            # both runs against eager's tokens through a float32 copy (a float32 model: eager is its own reference)
            assert r["agrees"] and r["as_accurate_as_eager"] and r["reference_worst"]["eager_vs_reference"] < 1e-5


def test_bench_tiny_json_and_plot(tmp_path, capsys):
    j, p, md = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "r.md"
    plot = ("--plot", str(p)) if importlib.util.find_spec("matplotlib") else ()  # the [plot] extra
    argv = tiny_bench_args("--json", str(j), *plot, "--markdown", str(md), "--cache-dir", str(tmp_path / "kc"))
    assert main(argv) == E.EXIT_OK
    out = capsys.readouterr().out
    assert "random weights" in out and out.startswith("speed numbers need a GPU")
    assert f"cache       {tmp_path / 'kc'} " in out and "median of 3" in out
    assert "correctness OK: greedy tokens identical to eager for 6 steps x batch 1,3" in out
    assert "s to patch" in out
    assert "sampling    seed 0" in out and "batch 3 OK: first decode step's logits" in out
    doc = json.loads(j.read_text())
    check_schema(doc, [1, 3], ["eager"])
    spreads = [f"batch {r['batch']} {r['run']} {r['spread_pct']:.1f}%" for r in doc["rows"] if r["spread_pct"] is not None]
    assert not spreads or "spread      of the 3 repetitions' step times (max - min over median): " + ", ".join(spreads) in out
    assert doc["settings"]["cache_dir"] == str(tmp_path / "kc") and doc["speed_note"].startswith("speed numbers")
    assert doc["model"]["num_hidden_layers"] == 2 and doc["model"]["random_weights"] is True
    assert doc["correctness"] == {"reference": "eager", "checked": True, "identical": True, "steps": 6,
                                  "first_divergence": None}
    table = [ln for ln in md.read_text().splitlines() if ln.startswith("| ")]
    assert table[0] == "| batch | run | ms/step | tok/s | % of floor | vs eager | warm-up s |"
    assert [ln.split(" | ")[:2] for ln in table[1:]] == [["| 1", "ours"], ["| 1", "eager"], ["| 3", "ours"],
                                                         ["| 3", "eager"]]
    assert doc["environment"]["command"].startswith("mirage-serve bench SmolLM2-135M --layers 2")
    if not plot:
        return
    series = json.loads(png_text(p)["mirage-serve-series"])
    assert series["batches"] == [1, 3] and set(series["series"]) == {"ours", "eager"}
    for row in doc["rows"]:
        assert series["series"][row["run"]][[1, 3].index(row["batch"])] == pytest.approx(row["tok_per_s"])


def test_bench_checkpoint_directory_with_weights(tmp_path, capsys):
    """A saved safetensors checkpoint loads with its own weights (not random) and passes."""
    import torch
    from transformers import AutoModelForCausalLM

    from mirage_serve import registry
    from .conftest import TINY_FACTS

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(registry.hf_config(TINY_FACTS))
    with torch.no_grad():
        for prm in model.parameters():
            prm.normal_(0, 0.02)
    model.save_pretrained(tmp_path / "ckpt")
    j = tmp_path / "r.json"
    argv = ["bench", str(tmp_path / "ckpt" / "model.safetensors"), "--batch", "3", "--prompt-len", "7", "--new-tokens", "4",
            "--device", "cpu", "--json", str(j)]
    assert main(argv) == E.EXIT_OK
    doc = json.loads(j.read_text())
    check_schema(doc, [3], ["eager"])
    assert doc["model"]["random_weights"] is False and doc["model"]["name"] == "ckpt"
    assert doc["correctness"]["identical"] is True


def test_bench_config_only_directory_gets_random_weights(tmp_path, capsys, monkeypatch):
    """config.json without weight files: random weights from that config (patch stubbed out)."""
    from .conftest import TINY_FACTS

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(TINY_FACTS))
    _use_patch(monkeypatch, *_no_patch())
    j = tmp_path / "r.json"
    assert main(["bench", str(tmp_path / "cfg"), "--batch", "2", "--new-tokens", "3", "--prompt-len", "5",
                 "--device", "cpu", "--json", str(j)]) == E.EXIT_OK
    doc = json.loads(j.read_text())
    check_schema(doc, [2], ["eager"], real_patch=False)
    assert doc["model"]["random_weights"] and "no weight files" in doc["model"]["source"]
    assert doc["patch"]["report"] == "no-op patch" and doc["correctness"]["identical"] is True


def _use_patch(monkeypatch, patch, unpatch) -> None:
    """The bench runs ``patch`` / ``unpatch`` in place of mirage_serve's (it imports them when it runs)."""
    from mirage_serve.patching import pipeline

    monkeypatch.setattr(pipeline, "patch", patch)
    monkeypatch.setattr(pipeline, "unpatch", unpatch)


def _no_patch():
    """A 'patch' that changes nothing (the tests that only look at loading and the baselines)."""
    return (lambda model, **kw: "no-op patch"), (lambda model: True)


def _sign_flip_patch():
    """A wrong 'patch': negates the final norm's weight, so the logits flip sign and greedy picks the
    argmin — tokens must diverge at the first step. (Not lm_head: SmolLM2 ties it to the embedding.)"""
    def patch(model, **kw):
        with __import__("torch").no_grad():
            model.model.norm.weight.neg_()
        return "sign-flip patch"

    def unpatch(model):
        with __import__("torch").no_grad():
            model.model.norm.weight.neg_()
    return patch, unpatch


def test_bench_reports_first_divergence(tmp_path, capsys, monkeypatch):
    _use_patch(monkeypatch, *_sign_flip_patch())
    j = tmp_path / "r.json"
    assert main(tiny_bench_args("--json", str(j))) == E.EXIT_INCORRECT
    out = capsys.readouterr().out
    assert "FAILED: greedy tokens diverge from eager at step 0 (batch 1, row 0" in out
    d = json.loads(j.read_text())["correctness"]
    assert d["identical"] is False and d["first_divergence"]["step"] == 0
    assert d["first_divergence"]["expected"] != d["first_divergence"]["got"]
    # Negated logits: eager's choice beats the argmin by far more than rounding, so no tie excuse.
    assert d["near_tie"] is False and d["logit_gap"] > 100 * d["tie_tolerance"] > 0


class _FixedLogits(__import__("torch").nn.Module):
    """A stand-in model whose logits are fixed: [0.5, 0.5 + delta, 0.1, ...] in bf16, and
    [0.5, 0.5 + delta32, 0.1, ...] once ``bench_sampling.reference`` widens it to float32."""

    def __init__(self, delta: float, delta32: float | None = None):
        import torch

        super().__init__()
        self.config = type("C", (), {"vocab_size": 11})()
        self.weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16), requires_grad=False)
        self.delta, self.delta32 = delta, delta if delta32 is None else delta32

    def forward(self, seq, attention_mask=None):
        import torch

        logits = torch.full((1, seq.shape[1], 11), 0.1)
        wide = self.weight.dtype == torch.float32
        logits[0, :, 0], logits[0, :, 1] = 0.5, 0.5 + (self.delta32 if wide else self.delta)  # at every position
        return type("O", (), {"logits": logits})()


def _tie(model):
    import torch

    opts = bench.BenchOptions(model=None, batches=[2], prompt_len=4, new_tokens=5, dtype="bf16",
                              baselines=["eager"], backend="torch", device="cpu")
    ref = torch.tensor([[3, 4, 1, 1, 1], [3, 4, 1, 1, 1]])
    d = {"batch": 2, "row": 1, "step": 2, "expected": 1, "got": 0}
    return bench._tie_check(model, opts, {"eager": {2: (0.0, ref)}}, d)


@pytest.mark.parametrize("delta, tie", [(0.0, True), (0.003, True), (0.05, False)])
def test_tie_check_uses_ulps_of_the_top_logit(delta, tie):
    out = _tie(_FixedLogits(delta))
    assert out["logit_gap"] == pytest.approx(delta, abs=1e-6)
    # 2 ulps of bf16 (eps 2^-7) at a top logit of ~0.5: 0.0078 (up to delta's own size).
    assert out["tie_tolerance"] == pytest.approx(2 * 2 ** -7 * (0.5 + delta))
    assert out["near_tie"] is tie
    # past the ulps, float32 agreeing with bf16 leaves it a divergence
    assert ("float32_gap" in out) is (not tie)


@pytest.mark.parametrize("delta32, tie", [(0.048, False), (0.02, True), (-0.01, True)])
def test_a_divergence_past_the_ulps_is_re_scored_in_float32(delta32, tie):
    # eager's bf16 gap 0.05: float32 0.048 (eager's own error 0.002, far below the gap) keeps it a
    # divergence; float32 0.02 (eager off by 0.03, more than the pair's separation) or float32
    # preferring the other token makes it a tie at bf16
    out = _tie(_FixedLogits(0.05, delta32))
    assert out["float32_gap"] == pytest.approx(delta32, abs=1e-6)
    assert out["eager_error"] == pytest.approx(abs(0.05 - delta32), abs=1e-3)
    assert out["near_tie"] is tie


def test_out_of_memory_reports_largest_batch(capsys, monkeypatch):
    """A batch that does not fit is reported with the largest batch that did (here 3 of 1,3,5)."""
    import torch

    real = bench.decode_step_time

    def fake(model, ids, *a, **kw):
        if ids.shape[0] >= 5:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, ids, *a, **kw)

    monkeypatch.setattr(bench, "decode_step_time", fake)
    argv = tiny_bench_args()
    argv[argv.index("1,3")] = "1,3,5"
    assert main(argv) == E.EXIT_OOM
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mirage-serve")]
    assert err == ["mirage-serve: error: out of GPU memory at batch 5; the largest batch that fits is 3 "
                   "(try --batch 3 or --layers N)"]


def test_eager_not_asked_for_runs_once_untimed(tmp_path, monkeypatch):
    """With --baselines static-compile, eager's greedy tokens are still the correctness reference, but
    eager is generated once a batch and never timed (no row, no warm-up, no repeats)."""
    from mirage_serve import bench_timing

    timed = []

    def fake(model, ids, new_tokens, cache, *a, every_run=None, warmup=None, **kw):  # no torch.compile on the CPU
        timed.append(cache)
        tokens = bench_timing.generate(model, ids, new_tokens, "static-eager" if cache == "static" else cache)
        every_run.extend([tokens, tokens])
        warmup.append(len(timed) + 0.5)  # what the warm-up took, per timed run (recorded in its row)
        return 1e-3, tokens

    monkeypatch.setattr(bench, "decode_step_time", fake)
    generated = []
    real_generate = bench.generate

    def counted(model, ids, new_tokens, cache):
        generated.append(cache)
        return real_generate(model, ids, new_tokens, cache)

    monkeypatch.setattr(bench, "generate", counted)
    j = tmp_path / "r.json"
    assert main(tiny_bench_args("--baselines", "static-compile", "--json", str(j),
                                "--cache-dir", str(tmp_path / "kc"))) == E.EXIT_OK
    doc = json.loads(j.read_text())
    assert timed == ["static", "static", "default", "default"]  # batches 1 and 3; never "dynamic"
    assert generated == ["dynamic", "dynamic"]  # eager's tokens, once per batch
    assert [(r["batch"], r["run"]) for r in doc["rows"]] == [(1, "ours"), (1, "static-compile"), (3, "ours"),
                                                             (3, "static-compile")]
    assert [r["warmup_seconds"] for r in doc["rows"]] == [3.5, 1.5, 4.5, 2.5]  # each run's own warm-up
    assert doc["correctness"]["checked"] and doc["correctness"]["identical"]
    assert doc["repeats"] == {"static-compile": {"1": None, "3": None}, "ours": {"1": None, "3": None}}


def test_a_run_whose_timed_runs_disagree_is_reported_not_repeatable(tmp_path, capsys, monkeypatch):
    """Greedy tokens that change between two timed runs of one prompt (a sum whose order changes
    from launch to launch) are named in the table and the record; correctness is judged apart."""
    real = bench.decode_step_time

    def fake(model, ids, *a, every_run=None, **kw):
        step, tokens = real(model, ids, *a, every_run=every_run, **kw)
        if ids.shape[0] == 3 and every_run is not None:  # batch 3: the last timed run moves row 2, step 4
            every_run[-1] = every_run[-1].clone()
            every_run[-1][2, 4] += 1
        return step, tokens

    monkeypatch.setattr(bench, "decode_step_time", fake)
    j = tmp_path / "r.json"
    assert main(tiny_bench_args("--json", str(j), "--cache-dir", str(tmp_path / "kc"))) == E.EXIT_OK
    moved = {"step": 4, "row": 2}
    for run in ("eager", "ours"):
        rec = json.loads(j.read_text())["repeats"][run]
        assert rec["1"] is None and {k: rec["3"][k] for k in moved} == moved
    assert "ours NOT repeatable: batch 3 differs from its first run at step 4 (row 2)" in capsys.readouterr().out


def _tiny_json_argv(j) -> list[str]:
    """A one-layer SmolLM2 shrunk by TINY_SET, on the CPU, writing its record to ``j``."""
    argv = ["bench", "SmolLM2-135M", "--layers", "1", "--batch", "1", "--new-tokens", "2", "--prompt-len", "3",
            "--device", "cpu", "--json", str(j)]
    for kv in TINY_SET:
        argv += ["--set", kv]
    return argv


def test_tiny_set_really_shrinks_the_model(tmp_path, monkeypatch):
    _use_patch(monkeypatch, *_no_patch())
    j = tmp_path / "r.json"
    argv = _tiny_json_argv(j)
    assert main(argv) == E.EXIT_OK
    m = json.loads(j.read_text())["model"]
    # embed 311×72 + lm_head (tied in SmolLM2) + 1 layer + final norm.
    assert m["params"] == 311 * 72 + (72 * 72 + 2 * 72 * 36 + 72 * 72 + 3 * 72 * 100 + 2 * 72) + 72


def test_patch_that_raises_keeps_the_baselines(tmp_path, capsys, monkeypatch):
    def broken(model, **kw):
        raise RuntimeError("kernel build exploded")

    _use_patch(monkeypatch, broken, lambda model: None)
    j = tmp_path / "r.json"
    assert main(tiny_bench_args("--json", str(j))) == E.EXIT_PATCH_FAILED
    out = capsys.readouterr().out
    assert "patch       failed: RuntimeError: kernel build exploded" in out
    doc = json.loads(j.read_text())
    check_schema(doc, [1, 3], ["eager"])
    assert [r["run"] for r in doc["rows"]] == ["eager", "eager"]


def test_no_graphs_patches_with_cuda_graphs_off(tmp_path, capsys, monkeypatch):
    from mirage_serve.patching import pipeline

    seen = []
    real = pipeline.patch

    def patch_spy(model, **kw):
        seen.append(kw.get("cuda_graphs", "default"))
        return real(model, **kw)

    monkeypatch.setattr(pipeline, "patch", patch_spy)
    j = tmp_path / "r.json"
    assert main(tiny_bench_args("--no-graphs", "--json", str(j), "--cache-dir", str(tmp_path / "kc"))) == E.EXIT_OK
    assert seen == [False, False]  # the measured patch and the warm re-patch
    assert json.loads(j.read_text())["settings"]["graphs"] is False
    assert "kernels alone" in capsys.readouterr().out


def test_a_float32_reference_that_fails_is_a_note_not_a_failed_bench(tmp_path, monkeypatch):
    """The float32 sampling reference is a second opinion: a model it cannot run still gets its
    bench, with a note saying why the patched logits were compared with eager's alone."""
    from mirage_serve import bench_sampling

    def broken(*a, **kw):
        raise RuntimeError("widening failed (simulated)")

    monkeypatch.setattr(bench_sampling, "reference", broken)
    j = tmp_path / "r.json"
    argv = _tiny_json_argv(j)
    assert main(argv) == E.EXIT_OK
    record = json.loads(j.read_text())
    assert any("no float32 reference (RuntimeError: widening failed" in n for n in record["notes"])
    assert all("reference_worst" not in r for r in record["sampling"].values())


def test_the_floor_comes_from_the_better_of_two_copy_measurements(tmp_path, capsys, monkeypatch):
    """One copy measurement can read low (session 34: 14% below the runs around it), which would flatter every
    % of floor; the bench measures before and after its timed runs and divides by the better."""
    readings = iter([2.5e12, 2.9e12])
    monkeypatch.setattr(bench, "_copy_bandwidth", lambda device: next(readings))
    j = tmp_path / "r.json"
    assert main(tiny_bench_args("--json", str(j), "--cache-dir", str(tmp_path / "kc"))) == E.EXIT_OK
    doc = json.loads(j.read_text())
    assert doc["copy_bandwidth_samples_GBps"] == [2500.0, 2900.0] and doc["copy_bandwidth_GBps"] == 2900.0
    assert doc["floor_ms"] == pytest.approx(doc["model"]["decode_bytes"] / 2.9e12 * 1e3)
    ours = next(r for r in doc["rows"] if r["run"] == "ours")
    assert ours["pct_of_floor"] == pytest.approx(100 * doc["floor_ms"] / ours["ms_per_step"])
    assert "copy 2900 GB/s (read + write, this run; the better of 2500 and 2900 GB/s" in capsys.readouterr().out


def test_the_spread_of_the_repetitions_is_max_minus_min_over_their_median():
    from mirage_serve.cli_bench import spread_line

    assert bench.spread_pct([1.0, 1.1, 0.9]) == pytest.approx(20.0)
    assert bench.spread_pct([2e-3]) is None and bench.spread_pct([]) is None
    assert bench.spread_pct([-1e-4, 1e-5, -2e-5]) is None  # a tiny model's noise: no positive median
    r = {"settings": {"repeats": 3}, "rows": [{"batch": 1, "run": "ours", "spread_pct": 0.42},
                                             {"batch": 1, "run": "eager", "spread_pct": None}]}
    assert spread_line(r) == "of the 3 repetitions' step times (max - min over median): batch 1 ours 0.4%"
    assert spread_line({"settings": {"repeats": 1}, "rows": [{"batch": 1, "run": "ours", "spread_pct": None}]}) == ""
