"""`bench --plot`: tok/s per batch size for ours and each baseline, as a grouped bar chart (matplotlib).

matplotlib is an optional extra (``pip install 'mirage-serve[plot]'``): without it ``--plot`` is
refused with one line, before anything is timed (``missing()``). The series also go into the PNG's
metadata as JSON (a ``mirage-serve-series`` text chunk), so tools and tests read back exactly what
was drawn.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

MISSING = "bench --plot needs matplotlib, an optional extra: pip install 'mirage-serve[plot]'"
SERIES_KEY = "mirage-serve-series"
# Fixed colours per run name (matplotlib's default cycle, in this order); other runs take the rest.
SERIES_COLORS = {"ours": "#1f77b4", "eager": "#ff7f0e", "static-compile": "#2ca02c"}
_EXTRA_COLORS = ("#d62728", "#9467bd", "#8c564b")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message is the one line the CLI prints."""


def missing() -> str | None:
    """``MISSING`` when matplotlib cannot be imported here, else None (cheap: nothing is imported)."""
    try:
        return None if importlib.util.find_spec("matplotlib") is not None else MISSING
    except ValueError:  # a matplotlib module object without a spec (a test's stand-in): importable
        return None


def series_color(name: str, index: int) -> str:
    return SERIES_COLORS.get(name) or _EXTRA_COLORS[index % len(_EXTRA_COLORS)]


def write_plot(path: str | Path, batches: list[int], series: dict[str, list[float | None]],
               title: str) -> dict[str, list[float | None]]:
    """Draw one group of bars per batch size, one bar per run (``None``: not measured, no bar) and
    write a PNG to ``path``; returns each run's drawn bar heights, ``None`` where none was drawn."""
    if any(len(v) != len(batches) for v in series.values()):
        raise ValueError(f"every series needs one value per batch size ({len(batches)})")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(MISSING) from None
    fig = Figure(figsize=(7.2, 4.2), dpi=100)  # no pyplot: no global figure state, no GUI backend
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    drawn: dict[str, list[float | None]] = {}
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, v in enumerate(values) if v is not None]
        ys = [float(v) for v in values if v is not None]
        bars = ax.bar(xs, ys, width, label=name, color=series_color(name, i))
        heights = iter(b.get_height() for b in bars)
        drawn[name] = [None if v is None else next(heights) for v in values]
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tok/s")
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    meta = {"Title": title, SERIES_KEY: json.dumps({"batches": batches, "series": series, "unit": "tok/s"})}
    fig.savefig(path, format="png", metadata=meta)
    return drawn
