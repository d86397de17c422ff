"""benchmarks/search_candidates.py: the designs a site program's search hands the GPU profiler, per
bucket, printed on a CPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "search_candidates.py"
_spec = importlib.util.spec_from_file_location("search_candidates", _PATH)
tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tool
_spec.loader.exec_module(tool)


@pytest.mark.parametrize("program", ["attn_in", "mlp_out"])  # mlp_out: its input is the MLP's width
def test_prints_the_searched_and_the_reinstantiated_buckets_candidates(program, capsys):
    tool.main(["SmolLM2-135M", program, "--batch", "4,2"])
    out = capsys.readouterr().out
    assert f"{program} at 4 rows: searched" in out and f"{program} at 2 rows: re-instantiated from m4" in out
    assert out.count("the profiler would time") == 2
    # every fused candidate kernel: its grid, threads, loop, tiles and the cost model's time
    assert "grid (" in out and " threads " in out and " loop " in out and " µs" in out


def test_names_the_programs_a_model_has_when_asked_for_another():
    with pytest.raises(SystemExit, match="no site program 'qkv'.*attn_in, norm"):
        tool.main(["SmolLM2-135M", "qkv", "--batch", "1"])


@pytest.mark.slow
def test_aot_adds_each_candidate_kernels_registers_and_shared_memory(capsys):
    tool.main(["SmolLM2-135M", "attn_in", "--batch", "2", "--aot"])
    out = capsys.readouterr().out
    kernels = [line for line in out.splitlines() if line.startswith("    grid (")]
    compiled = [line for line in kernels if " regs, " in line and " KB smem" in line]
    assert compiled and "?" not in " ".join(compiled)  # ptxas found and read
