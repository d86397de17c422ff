"""What a new user meets first: a typo answered before torch loads, CPU defaults that mean something,
warm's one summary saying what it built and where."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mirage_serve import cli_errors as E
from mirage_serve.cli import build_parser, main

# Run in a fresh interpreter: this test process has long since imported torch.
_PROBE = """
import json, sys
from mirage_serve.cli import main
codes = [main(argv) for argv in {argvs!r}]
heavy = [m for m in ("torch", "transformers", "triton", "numpy") if m in sys.modules]
print(json.dumps({{"codes": codes, "heavy": heavy}}))
"""


def _probe(argvs: list[list[str]]) -> dict:
    r = subprocess.run([sys.executable, "-c", _PROBE.format(argvs=argvs)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1]) | {"stderr": r.stderr}


def test_bad_model_arguments_are_answered_without_importing_torch(tmp_path):
    no_config = tmp_path / "empty_checkpoint"
    no_config.mkdir()
    argvs = [["bench", "Lama-3.1-8B"], ["bench", "Nope", "--device", "cpu"], ["warm", "Qwen2.5-0.6B"],
             ["bench", str(tmp_path / "missing.gguf")], ["bench", str(no_config)],
             ["warm", str(tmp_path / "missing.json")], ["warm", str(no_config)]]
    got = _probe(argvs)
    assert got["codes"] == [E.EXIT_UNKNOWN_MODEL] * 3 + [E.EXIT_BAD_CHECKPOINT] * 4, got
    assert got["heavy"] == [], got  # the whole point: no torch, transformers or triton loaded
    err = got["stderr"].splitlines()
    assert len(err) == len(argvs) and all(ln.startswith("mirage-serve: error: ") for ln in err), err
    assert "closest: Llama-3.1-8B" in err[0] and "Qwen2.5-0.5B" in err[2]
    assert "no such GGUF file" in err[3] and "has no config.json" in err[4] and "has no config.json" in err[6]


def test_warm_accepts_a_registry_hub_id_before_the_heavy_imports(monkeypatch, capsys):
    """The cheap check lets through what resolve_config accepts (a registry entry's hub id)."""
    from mirage_serve import cli_cache, registry

    entry = registry.get("Qwen3-0.6B")
    cli_cache.check_warm_model(entry.hub_id)
    cli_cache.check_warm_model(entry.hub_id.upper())
    with pytest.raises(registry.UnknownModelError):
        cli_cache.check_warm_model("someone/Qwen3-0.6B-finetune")


def _cpu_options(*argv: str):
    from mirage_serve.cli_bench import options

    return options(build_parser().parse_args(["bench", *argv, "--device", "cpu"]))


def test_cpu_bench_takes_the_median_of_three_by_default():
    opts = _cpu_options()
    assert opts.repeats == 3 and opts.device == "cpu" and opts.dtype == "fp32" and opts.backend == "torch"
    assert _cpu_options("--repeats", "5").repeats == 5


def test_cpu_speed_note_is_printed_before_the_model_loads(monkeypatch, capsys):
    """The note is the first line on stdout, printed before anything slow (here: a load that fails)."""
    from mirage_serve import cli_bench

    def failing_load(opts):
        print("LOADING", flush=True)
        raise E.CliError("stop here", E.EXIT_BAD_CHECKPOINT)

    monkeypatch.setattr(cli_bench, "_load", failing_load)
    assert main(["bench", "SmolLM2-135M", "--device", "cpu", "--new-tokens", "5"]) == E.EXIT_BAD_CHECKPOINT
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("speed numbers need a GPU: on CPU this run checks correctness of the torch "
                             "backend over 5 new tokens"), out
    assert out[1] == "LOADING"


def test_warm_on_cpu_defaults_to_fp32_and_prints_its_summary_once(tmp_path, monkeypatch, capsys):
    import torch

    import mirage_serve.cache.warm as warm

    seen = {}

    class Report:  # the PatchReport fields summary() reads
        device, backend, sites = "cpu", "torch", []

        def counts(self):
            return "2/2 sites patched; 2 distinct programs"

    def fake_warm(model, **kw):
        seen.update(kw)
        kw["progress"]("building", 1, 3)
        kw["progress"]("done", 3, 3)
        return warm.WarmResult(model, kw["dtype"], tuple(kw["batch_sizes"]), tmp_path, 1.25, 4, 7, Report())

    monkeypatch.setattr(warm, "warm_model", fake_warm)
    assert main(["warm", "Qwen3-0.6B", "--batch", "1,3", "--cache-dir", str(tmp_path)]) == E.EXIT_OK
    expected = "bf16" if torch.cuda.is_available() else "fp32"
    assert seen["dtype"] == expected
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == f"warmed Qwen3-0.6B in 1.2 s: {expected} kernels for batch buckets 1,3 on cpu, backend torch"
    assert lines[1] == f"  cache {tmp_path}: 3 new entries, 7 in all"
    assert lines[2] == "  2/2 sites patched; 2 distinct programs" and len(lines) == 3
    assert "warmed" not in out.err  # progress lines on stderr do not repeat the summary
