"""The zlib PNG writer behind `bench --plot`: a valid PNG that decodes back to the expected bars."""
from __future__ import annotations

import json
import struct
import zlib

import pytest

from mirage_serve.bench_plot import SERIES_COLORS, write_plot
from mirage_serve.bench_timing import Progress, first_divergence


def read_png(path) -> dict:
    """Parse a PNG written by bench_plot: checks signature, chunk CRCs, IHDR; returns pixels and tEXt."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, ctype, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = 1 + 3 * w
    assert len(raw) == h * stride
    rows = []
    for y in range(h):
        assert raw[y * stride] == 0  # filter type "None" on every scanline
        line = raw[y * stride + 1:(y + 1) * stride]
        rows.append([tuple(line[x * 3:x * 3 + 3]) for x in range(w)])
    text = dict(body.split(b"\x00", 1) for kind, body in chunks if kind == b"tEXt")
    return {"width": w, "height": h, "rows": rows, "text": {k.decode(): v.decode("latin-1") for k, v in text.items()}}


def _bar_height(rows, color, x_range, y_range) -> int:
    """Most pixels of `color` in any column of x_range within the plot's rows (the bar's height)."""
    return max(sum(1 for y in y_range if rows[y][x] == color) for x in x_range)


def test_png_is_valid_and_bars_match_values(tmp_path):
    batches = [1, 3, 8]
    series = {"ours": [130.0, 371.5, 905.0], "eager": [60.0, 170.0, 410.0], "static-compile": [95.0, None, 700.0]}
    layout = write_plot(tmp_path / "p.png", batches, series, "Qwen2.5-0.5B bf16 tok/s")
    png = read_png(tmp_path / "p.png")
    assert (png["width"], png["height"]) == (720, 420)
    meta = json.loads(png["text"]["mirage-serve-series"])
    assert meta == {"batches": batches, "series": series, "unit": "tok/s"}
    assert png["text"]["Title"] == "Qwen2.5-0.5B bf16 tok/s"
    plot_h = layout["plot_box"][3] - layout["plot_box"][1]
    for name, values in series.items():
        color = SERIES_COLORS[name]
        for v, box in zip(values, layout["bars"][name]):
            if v is None:
                assert box is None
                continue
            measured = _bar_height(png["rows"], color, range(box[0], box[2]),
                                   range(layout["plot_box"][1], layout["plot_box"][3]))
            # The bar's pixels read back from the file give the value to within a pixel.
            assert abs(measured - v / layout["y_top"] * plot_h) <= 1.0, (name, v, measured)
    # Ordering survives: at every batch the tallest bar is ours.
    for i in range(len(batches)):
        heights = {n: layout["bars"][n][i][3] - layout["bars"][n][i][1]
                   for n in series if layout["bars"][n][i] is not None}
        assert max(heights, key=heights.get) == "ours"


def test_png_without_values_is_still_valid(tmp_path):
    write_plot(tmp_path / "e.png", [1], {"ours": [None]}, "empty")
    png = read_png(tmp_path / "e.png")
    flat = {px for row in png["rows"] for px in row}
    assert SERIES_COLORS["ours"] in flat  # the legend swatch, though no bar was drawn


def test_first_divergence_finds_earliest_step_and_row():
    import torch

    ref = torch.arange(3 * 7).reshape(3, 7)
    got = ref.clone()
    assert first_divergence(ref, got) is None
    got[2, 4] = -1
    got[1, 5] = -1
    assert first_divergence(ref, got) == {"step": 4, "row": 2, "expected": int(ref[2, 4]), "got": -1}


def test_progress_writes_one_line_per_step_off_a_terminal(capsys):
    import io

    buf = io.StringIO()
    prog = Progress("bench", 3, stream=buf, width=6)
    for _ in range(4):  # one more than total: clamps
        prog.step("timed")
    lines = buf.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["bench [##----] 1/3 timed", "bench [####--] 2/3 timed",
                                                  "bench [######] 3/3 timed", "bench [######] 3/3 timed"]


@pytest.mark.parametrize("v", [0.7, 3.0, 99.0, 1234.0])
def test_axis_top_is_a_round_ceiling(v):
    from mirage_serve.bench_plot import _nice_ceiling

    top = _nice_ceiling(v)
    assert v <= top <= 2.5 * v and f"{top:.0e}"[0] in "125"
