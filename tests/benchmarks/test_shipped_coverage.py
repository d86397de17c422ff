"""The committed kernels_cache/ still serves registry models: a change to extraction, to the
canonical program text or to the cache key that silently orphaned every shipped entry (users
would pay a search on their first patch()) fails here. Two small models, checked on the CPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "shipped_coverage.py"
_spec = importlib.util.spec_from_file_location("shipped_coverage", _PATH)
coverage = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = coverage
_spec.loader.exec_module(coverage)


@pytest.mark.parametrize("model", ["SmolLM2-135M", "Qwen2.5-0.5B"])
def test_every_program_of_the_model_has_a_shipped_entry(model, capsys):
    with pytest.raises(SystemExit) as done:
        coverage.main([model])
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert "30/ 30 programs shipped" in out
