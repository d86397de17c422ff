"""Exit codes of `mirage-serve` and the one error type its commands raise (kept apart from cli.py so
`python -m mirage_serve.cli` and the subcommand modules share one CliError class)."""
from __future__ import annotations

EXIT_OK = 0
# 1 is left to Python itself (an uncaught exception): a bug, never a user error.
EXIT_USAGE = 2  # argparse's own code for bad arguments
EXIT_UNKNOWN_MODEL = 3
EXIT_NO_GPU = 4
EXIT_OOM = 5
EXIT_BAD_CHECKPOINT = 6
EXIT_UNAVAILABLE = 7  # a component this build lacks (patch, search, cache back end) or no hub access
EXIT_CACHE = 8  # the cache refused (read-only, bad archive)
EXIT_INCORRECT = 9  # the patched model disagreed with eager, or verification failed
EXIT_PATCH_FAILED = 10  # bench: patch() raised; the baselines are still printed


class CliError(Exception):
    """An error reported as one line on stderr with its exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code
