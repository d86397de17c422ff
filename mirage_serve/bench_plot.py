"""`bench --plot`: a grouped bar chart of tok/s per batch size, written as a PNG with zlib alone.

No plotting dependency: a small RGB canvas, a 3×5 bitmap font for labels, and a PNG writer (IHDR, one
IDAT of filter-0 scanlines, tEXt, IEND). The series values also go into a `mirage-serve-series` tEXt
chunk as JSON, so tools and tests can read back exactly what was drawn.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

# Fixed colours per run name (tests look for them); other runs cycle through the rest.
SERIES_COLORS = {"ours": (31, 119, 180), "eager": (255, 127, 14), "static-compile": (44, 160, 44)}
_EXTRA_COLORS = [(214, 39, 40), (148, 103, 189), (140, 86, 75)]
BACKGROUND, INK, GRID = (255, 255, 255), (30, 30, 30), (220, 220, 220)

# 3 columns × 5 rows per glyph, rows top to bottom separated by "|", "#" = ink.
_FONT = {
    "0": "###|#.#|#.#|#.#|###", "1": ".#.|##.|.#.|.#.|###", "2": "###|..#|###|#..|###",
    "3": "###|..#|.##|..#|###", "4": "#.#|#.#|###|..#|..#", "5": "###|#..|###|..#|###",
    "6": "###|#..|###|#.#|###", "7": "###|..#|.#.|.#.|.#.", "8": "###|#.#|###|#.#|###",
    "9": "###|#.#|###|..#|###", "A": ".#.|#.#|###|#.#|#.#", "B": "##.|#.#|##.|#.#|##.",
    "C": ".##|#..|#..|#..|.##", "D": "##.|#.#|#.#|#.#|##.", "E": "###|#..|##.|#..|###",
    "F": "###|#..|##.|#..|#..", "G": ".##|#..|#.#|#.#|.##", "H": "#.#|#.#|###|#.#|#.#",
    "I": "###|.#.|.#.|.#.|###", "J": "..#|..#|..#|#.#|.#.", "K": "#.#|#.#|##.|#.#|#.#",
    "L": "#..|#..|#..|#..|###", "M": "#.#|###|###|#.#|#.#", "N": "##.|#.#|#.#|#.#|#.#",
    "O": ".#.|#.#|#.#|#.#|.#.", "P": "##.|#.#|##.|#..|#..", "Q": ".#.|#.#|#.#|##.|.##",
    "R": "##.|#.#|##.|#.#|#.#", "S": ".##|#..|.#.|..#|##.", "T": "###|.#.|.#.|.#.|.#.",
    "U": "#.#|#.#|#.#|#.#|###", "V": "#.#|#.#|#.#|#.#|.#.", "W": "#.#|#.#|###|###|#.#",
    "X": "#.#|#.#|.#.|#.#|#.#", "Y": "#.#|#.#|.#.|.#.|.#.", "Z": "###|..#|.#.|#..|###",
    "-": "...|...|###|...|...", ".": "...|...|...|...|.#.", "/": "..#|..#|.#.|#..|#..",
    ":": "...|.#.|...|.#.|...", "=": "...|###|...|###|...", "(": "..#|.#.|.#.|.#.|..#",
    ")": "#..|.#.|.#.|.#.|#..", "%": "#.#|..#|.#.|#..|#.#", "_": "...|...|...|...|###",
    "+": "...|.#.|###|.#.|...", ",": "...|...|...|.#.|#..",
}


def _glyph(ch: str) -> list[str]:
    """Five rows of three cells; unknown characters draw as blanks."""
    return _FONT.get(ch.upper(), "...|...|...|...|...").split("|")


class Canvas:
    """An RGB image held as rows of bytes; (0, 0) is the top-left pixel."""

    def __init__(self, width: int, height: int, color=BACKGROUND):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(color) * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color) -> None:
        """Fill [x0, x1) × [y0, y1), clipped to the canvas."""
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start:start + len(row)] = row

    def text(self, x: int, y: int, s: str, color=INK, scale: int = 2) -> None:
        for i, ch in enumerate(s):
            for r, bits in enumerate(_glyph(ch)):
                for c, bit in enumerate(bits):
                    if bit == "#":
                        px, py = x + (i * 4 + c) * scale, y + r * scale
                        self.rect(px, py, px + scale, py + scale, color)

    @staticmethod
    def text_width(s: str, scale: int = 2) -> int:
        return len(s) * 4 * scale


def png_bytes(canvas: Canvas, text: dict[str, str] | None = None) -> bytes:
    """The canvas as a PNG file: 8-bit RGB, no interlace, filter 0 on every scanline."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    w, h = canvas.width, canvas.height
    raw = b"".join(b"\x00" + bytes(canvas.pixels[y * w * 3:(y + 1) * w * 3]) for y in range(h))
    out = [b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))]
    for key, value in (text or {}).items():
        out.append(chunk(b"tEXt", key.encode("latin-1") + b"\x00" + value.encode("latin-1")))
    out += [chunk(b"IDAT", zlib.compress(raw, 9)), chunk(b"IEND", b"")]
    return b"".join(out)


def _nice_ceiling(v: float) -> float:
    """The smallest 1/2/5 × 10^k at or above v (axis top)."""
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 5, 10):
        if m * mag >= v:
            return m * mag
    return 10 * mag


def _fmt(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.3g}"


def series_color(name: str, index: int):
    return SERIES_COLORS.get(name, _EXTRA_COLORS[index % len(_EXTRA_COLORS)])


def bar_chart(batches: list[int], series: dict[str, list[float | None]], title: str,
              width: int = 720, height: int = 420) -> tuple[Canvas, dict]:
    """Draw tok/s bars: one group per batch size, one bar per series. Returns (canvas, layout).

    layout gives, per series, the pixel box of each bar (for tests) and the axis top value.
    """
    cv = Canvas(width, height)
    left, right, top, bottom = 80, 20, 50, 60
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for vs in series.values() for v in vs if v is not None]
    y_top = _nice_ceiling(max(values, default=1.0))
    cv.text(left, 12, title[: (width - left) // 8])
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):  # horizontal grid and y labels
        y = top + plot_h - round(frac * plot_h)
        cv.rect(left, y, left + plot_w, y + 1, GRID)
        label = _fmt(frac * y_top)
        cv.text(left - 6 - Canvas.text_width(label), y - 5, label)
    cv.text(8, top - 20, "TOK/S")
    n_series = max(len(series), 1)
    group_w = plot_w / max(len(batches), 1)
    bar_w = max(2, int(group_w * 0.8 / n_series))
    boxes: dict[str, list[tuple[int, int, int, int] | None]] = {}
    for si, (name, vals) in enumerate(series.items()):
        color, boxes[name] = series_color(name, si), []
        for bi, v in enumerate(vals):
            if v is None:
                boxes[name].append(None)
                continue
            x0 = left + int(bi * group_w + group_w * 0.1) + si * bar_w
            bar_h = max(1, round(v / y_top * plot_h))
            box = (x0, top + plot_h - bar_h, x0 + bar_w - 1, top + plot_h)
            cv.rect(box[0], box[1], box[2], box[3], color)
            boxes[name].append(box)
    for bi, b in enumerate(batches):  # x labels under each group
        label = f"B={b}"
        cx = left + int((bi + 0.5) * group_w)
        cv.text(cx - Canvas.text_width(label) // 2, top + plot_h + 10, label)
    cv.rect(left, top + plot_h, left + plot_w, top + plot_h + 2, INK)  # x axis
    cv.rect(left - 2, top, left, top + plot_h + 2, INK)  # y axis
    lx = left + 10
    for si, name in enumerate(series):  # legend along the bottom
        cv.rect(lx, height - 22, lx + 14, height - 8, series_color(name, si))
        cv.text(lx + 20, height - 20, name)
        lx += 20 + Canvas.text_width(name) + 24
    return cv, {"y_top": y_top, "plot_box": (left, top, left + plot_w, top + plot_h), "bars": boxes}


def write_plot(path: str | Path, batches: list[int], series: dict[str, list[float | None]],
               title: str) -> dict:
    """Write the tok/s chart to `path`; returns the layout (see `bar_chart`)."""
    cv, layout = bar_chart(batches, series, title)
    meta = {"Title": title, "mirage-serve-series": json.dumps({"batches": batches, "series": series,
                                                               "unit": "tok/s"})}
    Path(path).write_bytes(png_bytes(cv, meta))
    return layout
