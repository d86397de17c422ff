"""Every patch test gets its own empty kernel cache and default knobs, so results never depend on
~/.cache or the environment."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_kernel_cache(tmp_path, monkeypatch):
    # and no knob of the developer's environment (a test that wants one sets it)
    from mirage_serve.knobs import KNOBS

    for knob in KNOBS:
        monkeypatch.delenv(knob.name, raising=False)
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", str(tmp_path / "kernel_cache"))
