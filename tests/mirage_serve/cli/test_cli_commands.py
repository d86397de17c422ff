"""Every `mirage-serve` subcommand and user error path: one stderr line and its own exit code."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mirage_serve import cli_errors as E
from mirage_serve.cli import main
from mirage_serve import registry

from .conftest import TINY_FACTS


def _one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mirage-serve")]
    assert len(err) == 1, err
    return err[0]


def test_models_lists_every_entry_with_sizes(capsys):
    assert main(["models"]) == E.EXIT_OK
    out = capsys.readouterr().out
    for e in registry.entries():
        line = next(ln for ln in out.splitlines() if ln.startswith(e.name + " "))
        assert f"{registry.decode_bytes(e.config) / 1e9:.2f}" in line and e.hub_id in line
    assert "8.03B" in out and "494M" in out


def test_console_script_entry_point_runs():
    """The installed entry point (python -m on the same main) exits 0 and prints the table."""
    r = subprocess.run([sys.executable, "-m", "mirage_serve.cli", "models"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "Qwen3-8B" in r.stdout


def test_no_command_prints_help_and_usage_code(capsys):
    assert main([]) == E.EXIT_USAGE
    assert "bench" in capsys.readouterr().out


def test_unknown_model_names_closest(capsys):
    assert main(["bench", "Qwen2.5-0.6B", "--device", "cpu"]) == E.EXIT_UNKNOWN_MODEL
    line = _one_error_line(capsys)
    assert "unknown model 'Qwen2.5-0.6B'" in line and "Qwen2.5-0.5B" in line


def test_checkpoint_directory_without_config(tmp_path, capsys):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert main(["bench", str(tmp_path), "--device", "cpu"]) == E.EXIT_BAD_CHECKPOINT
    assert "has no config.json" in _one_error_line(capsys)


def test_missing_checkpoint_path(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nope.gguf"), "--device", "cpu"]) == E.EXIT_BAD_CHECKPOINT
    assert "no such GGUF file" in _one_error_line(capsys)
    assert main(["bench", "./no/such/dir", "--device", "cpu"]) == E.EXIT_BAD_CHECKPOINT


@pytest.mark.parametrize("argv", [["bench", "--backend", "triton"], ["bench", "--device", "cuda"],
                                  ["warm", "SmolLM2-135M", "--backend", "triton"]])
def test_gpu_only_options_without_gpu(argv, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(argv) == E.EXIT_NO_GPU
    assert "needs a CUDA GPU" in _one_error_line(capsys)


def test_bad_arguments_are_usage_errors(capsys):
    for argv in (["bench", "--batch", "0"], ["bench", "--baselines", "eager,fast"], ["bench", "--set", "x"],
                 ["bench", "--layers", "0"], ["bench", "--repeats", "-1"], ["bench", "--prompt-len", "x"],
                 ["cache", "frobnicate"], ["warm"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == E.EXIT_USAGE
    assert main(["bench", "--new-tokens", "1", "--device", "cpu"]) == E.EXIT_USAGE


def test_hub_id_without_network_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["bench", "no-such-org/no-such-model-73", "--device", "cpu"]) == E.EXIT_UNAVAILABLE
    assert "cannot load 'no-such-org/no-such-model-73' from the hub" in _one_error_line(capsys)


def test_cache_ls_verify_export_import_clear(tmp_path, capsys):
    d = str(tmp_path / "cache")
    assert main(["cache", "--cache-dir", d, "ls"]) == E.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert "entries; user cache" in lines[-1]
    assert not [ln for ln in lines if ln.startswith("user ")]  # the user cache is empty
    assert all(" yes " in ln for ln in lines if ln.startswith("shipped "))  # kernels_cache/ entries are sound
    assert main(["cache", "--cache-dir", d, "verify"]) == E.EXIT_OK
    archive = str(tmp_path / "c.tar")
    assert main(["cache", "--cache-dir", d, "export", archive]) == E.EXIT_OK
    assert main(["cache", "--cache-dir", str(tmp_path / "other"), "import", archive]) == E.EXIT_OK
    assert main(["cache", "--cache-dir", d, "clear"]) == E.EXIT_OK
    assert "removed 0 entries" in capsys.readouterr().out
    assert main(["cache", "--cache-dir", d, "import", str(tmp_path / "missing.tar")]) == E.EXIT_CACHE
    assert "cache import failed" in _one_error_line(capsys)


def test_cache_verify_reports_a_corrupt_entry(tmp_path, capsys):
    """A user entry whose file no longer matches its hash is listed as bad, with exit EXIT_CACHE."""
    from mirage_serve.cache import CacheEntry, CacheKey, KernelCache, versions_now

    cache = KernelCache(tmp_path, shipped_dir=False)
    key = CacheKey("d" * 64, "b3", "bf16", "sm90", "triton", versions_now(), "rmsnorm_matmul-test")
    path = cache.put(key, CacheEntry("kernel fused\n", {"kernel.py": "# src\n"}, {"kernel.cubin": b"\x7fELF"},
                                     {}))
    assert main(["cache", "--cache-dir", str(tmp_path), "verify"]) == E.EXIT_OK
    capsys.readouterr()
    victim = next(p for p in path.iterdir() if p.name != "meta.json" and p.is_file())
    victim.write_text("tampered")
    assert main(["cache", "--cache-dir", str(tmp_path), "verify"]) == E.EXIT_CACHE
    out = capsys.readouterr().out
    assert "1 bad" in out and path.name in out


def test_warm_unknown_model(capsys):
    assert main(["warm", "Gemma-2-3B"]) == E.EXIT_UNKNOWN_MODEL
    assert "Gemma-2-2B" in _one_error_line(capsys)


def test_warm_passes_its_options_to_the_cache_back_end(tmp_path, capsys, monkeypatch):
    """The CLI wiring of warm, with the (minutes-long) search stubbed out."""
    import mirage_serve.cache.warm as warm

    seen = {}

    class Result:
        def summary(self):
            return "warmed stub"

    def fake_warm(model, **kw):
        seen.update(kw, model=model)
        kw["progress"]("stub stage", 1, 1)
        return Result()

    monkeypatch.setattr(warm, "warm_model", fake_warm)
    rc = main(["warm", "Qwen3-0.6B", "--batch", "3,1", "--dtype", "fp16", "--layers", "2",
               "--cache-dir", str(tmp_path), "--cache-lengths", "4096,384"])
    assert rc == E.EXIT_OK
    assert seen["model"] == "Qwen3-0.6B" and seen["batch_sizes"] == [1, 3] and seen["dtype"] == "fp16"
    assert seen["num_layers"] == 2 and seen["cache_dir"] == str(tmp_path) and seen["backend"] is None
    assert seen["cache_lengths"] == [384, 4096]
    out = capsys.readouterr()
    assert out.out.strip() == "warmed stub" and "warm [1/1] stub stage" in out.err


@pytest.mark.parametrize("argv,words", [
    (["--cache-lengths", "2"], "--cache-lengths: cache lengths are prompt + new tokens, at least 3; got [2]"),
    (["--cache-lengths", "512", "--tp", "2"], "--cache-lengths is not supported with --tp yet"),
])
def test_warm_refuses_cache_lengths_it_cannot_choose(argv, words, capsys):
    assert main(["warm", "Llama-3.1-8B", *argv]) == E.EXIT_USAGE
    assert words in _one_error_line(capsys)


@pytest.mark.slow
def test_warm_tiny_config_fills_cache(tmp_path, capsys):
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY_FACTS))
    rc = main(["warm", str(cfg), "--batch", "1,3", "--dtype", "fp32", "--layers", "1",
               "--cache-dir", str(tmp_path / "cache"), "--backend", "torch"])
    assert rc == E.EXIT_OK
    out = capsys.readouterr()
    assert out.out.startswith("warmed tiny in ") and "fp32 kernels for batch buckets 1,3 on cpu" in out.out
    assert f"cache {tmp_path / 'cache'}: " in out.out and out.out.count("warmed") == 1
    assert "warm [3/3] done" in out.err


def test_verify_demo(capsys):
    rc = main(["verify-demo"])
    assert rc == E.EXIT_OK
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("search: ") and "verified μGraphs" in lines[0]
    assert lines[-1].startswith("verdict: equivalent") and "trials" in lines[-1] and "bound" in lines[-1]


@pytest.mark.slow
def test_bare_bench_runs_the_embedded_default_on_cpu():
    """The README's main job: `mirage-serve bench` with no model, on CPU, checks correctness."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the bare command runs the full GPU benchmark")
    # 595 s measured on 2 cores at load average 10-13 (three timed repeats of each run)
    r = subprocess.run([sys.executable, "-m", "mirage_serve.cli", "bench"], capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "correctness OK: greedy tokens identical to eager for 8 steps x batch 1" in r.stdout
    assert r.stdout.startswith("speed numbers need a GPU") and "median of 3" in r.stdout
    from mirage_serve.bench_load import smollm2_gguf

    assert ("SmolLM2-135M" in r.stdout) if smollm2_gguf() else ("small-llama" in r.stdout)
