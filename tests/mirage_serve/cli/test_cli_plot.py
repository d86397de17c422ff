"""`bench --plot` (matplotlib, an optional extra) and the bench's progress and divergence helpers."""
from __future__ import annotations

import json
import struct
import sys
import zlib

import pytest

from mirage_serve import bench_plot
from mirage_serve.bench_timing import Progress, first_divergence


def png_text(path) -> dict[str, str]:
    """The text chunks of a PNG (signature and chunk CRCs checked): what the plot's metadata holds."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, text, kinds = 8, {}, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        kinds.append(kind)
        if kind == b"tEXt":
            k, v = body.split(b"\x00", 1)
            text[k.decode("latin-1")] = v.decode("latin-1")
        elif kind == b"iTXt":  # keyword, flag, method, language, translated keyword, text (UTF-8)
            k, rest = body.split(b"\x00", 1)
            text[k.decode("latin-1")] = rest[2:].split(b"\x00", 2)[2].decode()
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    return text


def test_png_holds_the_series_and_bars_match_values(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the [plot] extra) is not installed")
    batches = [1, 3, 8]
    series = {"ours": [130.0, 371.5, 905.0], "eager": [60.0, 170.0, 410.0], "static-compile": [95.0, None, 700.0]}
    drawn = bench_plot.write_plot(tmp_path / "p.png", batches, series, "Qwen2.5-0.5B bf16 tok/s")
    assert drawn == series  # one bar per measured value, of that height; none where a run was not measured
    text = png_text(tmp_path / "p.png")
    assert json.loads(text[bench_plot.SERIES_KEY]) == {"batches": batches, "series": series, "unit": "tok/s"}
    assert text["Title"] == "Qwen2.5-0.5B bf16 tok/s"


def test_a_plot_without_values_is_still_written(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the [plot] extra) is not installed")
    assert bench_plot.write_plot(tmp_path / "e.png", [1], {"ours": [None]}, "empty") == {"ours": [None]}
    assert json.loads(png_text(tmp_path / "e.png")[bench_plot.SERIES_KEY])["series"] == {"ours": [None]}


def test_series_of_another_length_are_refused(tmp_path):
    with pytest.raises(ValueError, match="one value per batch size"):
        bench_plot.write_plot(tmp_path / "x.png", [1, 8], {"ours": [1.0]}, "t")


def test_without_matplotlib_the_plot_is_refused_in_one_line(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(bench_plot.importlib.util, "find_spec", lambda name: None)
    assert bench_plot.missing() == bench_plot.MISSING and "\n" not in bench_plot.MISSING
    with pytest.raises(bench_plot.PlotUnavailable, match=r"pip install 'mirage-serve\[plot\]'"):
        bench_plot.write_plot(tmp_path / "p.png", [1], {"ours": [1.0]}, "t")
    assert not (tmp_path / "p.png").exists()


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


def test_bench_plot_without_matplotlib_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    from mirage_serve import bench, cli_bench
    from mirage_serve import cli_errors as E
    from mirage_serve.cli import main

    from .conftest import tiny_bench_args

    monkeypatch.setattr(cli_bench, "plot_missing", lambda: bench_plot.MISSING)
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("the bench ran"))
    assert main(tiny_bench_args("--plot", str(tmp_path / "p.png"))) == E.EXIT_USAGE
    err = capsys.readouterr().err
    assert bench_plot.MISSING in err and not (tmp_path / "p.png").exists()
