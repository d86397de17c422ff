"""Every patch test gets its own empty kernel cache, so results never depend on what an earlier test
searched (the knobs are reset for every test in tests/conftest.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", str(tmp_path / "kernel_cache"))
