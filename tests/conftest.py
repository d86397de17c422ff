"""Shared test set-up: no network, a kernel cache of the test session's own, the knobs at their defaults,
and the `gpu` marker skips with a reason where there is no GPU."""
from __future__ import annotations

import functools
import os

# Tests never reach a model hub (the workplace has no network; tests use loopback only).
# huggingface_hub reads these once, at import, so they are set before anything imports it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest


@functools.lru_cache(maxsize=1)
def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (run GPU tests on the device machine)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or _cuda_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu test skipped: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def _session_kernel_cache(tmp_path_factory):
    # Never the developer's (or the GPU session's) cache: a test's tiny-model entries leaked into a
    # `warm` export once. One per session, so tests still share their searches (tests/patches
    # narrows it to one per test).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIRAGE_SERVE_CACHE_DIR", str(tmp_path_factory.mktemp("kernel_cache")))
        # and never the developer's cache secret (mirage_serve.cache.trust): one of the session's own
        mp.setenv("MIRAGE_SERVE_CACHE_KEY", str(tmp_path_factory.mktemp("cache_key") / "cache-key"))
        yield


@pytest.fixture(autouse=True)
def _default_knobs(monkeypatch):
    # no knob of the developer's environment changes an outcome (a test that wants one sets it)
    from mirage_serve.knobs import CACHE_DIR, CACHE_KEY, KNOBS

    for knob in KNOBS:
        if knob not in (CACHE_DIR, CACHE_KEY):
            monkeypatch.delenv(knob.name, raising=False)
