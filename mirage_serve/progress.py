"""What patch() and a first decode step are doing when it takes long: a line on stderr as something slow starts,
finished with its seconds when it ends.

A cold ``patch()`` searches each site's program (seconds to a minute each), and the first decode step of each new
shape chooses its decode-attention μGraph (about a minute on a cold cache). Without a word the user sees a stalled
call. Only the slow things announce themselves (a search, a re-instantiation timed on the GPU, the verification of
a cache entry this user did not sign, an attention choice); a warm patch prints nothing.
``MIRAGE_SERVE_PROGRESS=0`` silences them (``knobs.PROGRESS``).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from . import knobs

_open = False  # a started line waits for its "done in …" (nothing else was printed by us since)


def _write(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


@contextmanager
def slow(what: str):
    """``with slow("x: searching"):`` writes ``mirage_serve: x: searching ...`` now and `` done in 1.2 s`` after it,
    on the same line unless something nested printed in between (then the end gets a line of its own)."""
    global _open
    if not knobs.PROGRESS.get():
        yield
        return
    if _open:
        _write("\n")
    _write(f"mirage_serve: {what} ...")
    _open = True
    t0 = time.perf_counter()
    ok = False
    try:
        yield
        ok = True
    finally:
        end = f"{'done' if ok else 'stopped by an error'} in {time.perf_counter() - t0:.1f} s\n"
        _write(f" {end}" if _open else f"mirage_serve: {what}: {end}")
        _open = False
