"""What patch() and a first decode step are doing when it takes long: a line on stderr as something slow starts,
and one when it ends, with its seconds.

A cold ``patch()`` searches each site's program (seconds to a minute each), and the first decode step of each new
shape chooses its decode-attention μGraph (about a minute on a cold cache). Without a word the user sees a stalled
call. Only the slow things announce themselves (a search, a re-instantiation with its GPU profile, an attention
choice); a warm patch prints nothing. ``MIRAGE_SERVE_PROGRESS=0`` silences them (``knobs.PROGRESS``).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from . import knobs


@contextmanager
def slow(what: str):
    """``with slow("searching …"):`` prints ``mirage_serve: searching … ...`` now and the seconds it took after
    (or that it failed)."""
    if not knobs.PROGRESS.get():
        yield
        return
    print(f"mirage_serve: {what} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    ok = False
    try:
        yield
        ok = True
    finally:
        print(f"mirage_serve: {what}: {'done' if ok else 'stopped by an error'} in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
