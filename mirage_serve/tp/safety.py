"""NVLink multicast stays off in every tensor-parallel process (docs/tensor-parallel.md, "Safety").

A program that uses NVLink multicast (NCCL's NVLS algorithms, torch's symmetric memory, NVSHMEM)
can take the shared GPU hosts out of service for a day. The launcher sets these variables for
every process it starts; every worker asserts them before touching torch.distributed.
"""
from __future__ import annotations

import os

# variable -> the value that turns multicast off
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


class MulticastError(RuntimeError):
    """A tensor-parallel process was started without multicast turned off."""


def multicast_off_env(env: dict | None = None) -> dict:
    """A copy of ``env`` (default: this process's) with multicast turned off."""
    out = dict(os.environ if env is None else env)
    out.update(MULTICAST_OFF)
    return out


def set_multicast_off() -> None:
    """Turn multicast off in this process (before torch.distributed or NCCL is initialised)."""
    os.environ.update(MULTICAST_OFF)


def assert_multicast_off(env: dict | None = None) -> None:
    env = os.environ if env is None else env
    wrong = [f"{k}={env.get(k)!r} (need {v})" for k, v in MULTICAST_OFF.items() if env.get(k) != v]
    if wrong:
        raise MulticastError("NVLink multicast must stay off in tensor-parallel processes: " + ", ".join(wrong)
                             + "; start them through `mirage-serve bench --tp` or set these variables")
