"""Whether Triton runs kernels in its CPU interpreter in this process (``TRITON_INTERPRET=1``).

A leaf module: the builders, the launchers and the dependent-launch decision all ask it, and it
imports nothing of theirs.
"""
from __future__ import annotations

import os


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter in this process.

    ``TRITON_INTERPRET=1`` must be set before triton is first imported: triton decorates its own
    library functions at import, so the mode cannot change inside a process. (Triton's own switch,
    read here as Triton reads it; not one of mirage_serve's knobs.)
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
