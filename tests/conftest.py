"""Shared test set-up: no network, and the `gpu` marker skips with a reason where there is no GPU."""
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
