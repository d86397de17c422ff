"""The knobs module: typed, call-time reads, and the rule that no other mirage_serve module reads
the environment."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mirage_serve import knobs

ROOT = Path(__file__).resolve().parents[2]
# Reads of the environment: os.getenv(...), os.environ.get(...), os.environ[...] not assigned.
_READS = re.compile(r"os\.getenv\(|environ\.get\(|environ\.setdefault\(|environ\[[^\]]+\](?!\s*=[^=])")


def test_knobs_parse_at_call_time(monkeypatch, tmp_path):
    monkeypatch.delenv("MIRAGE_SERVE_CACHE_DIR", raising=False)
    assert knobs.CACHE_DIR.get() is None and not knobs.CACHE_DIR.is_set()
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", str(tmp_path))
    assert knobs.CACHE_DIR.get() == tmp_path
    for raw, want in [("1", True), ("Yes", True), ("off", False), ("0", False)]:
        monkeypatch.setenv("MIRAGE_SERVE_CACHE_READ_ONLY", raw)
        assert knobs.CACHE_READ_ONLY.get() is want
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_READ_ONLY", "maybe")
    with pytest.raises(ValueError, match="MIRAGE_SERVE_CACHE_READ_ONLY='maybe' is invalid"):
        knobs.CACHE_READ_ONLY.get()


def test_every_knob_is_listed_and_described():
    names = [k.name for k in knobs.KNOBS]
    assert len(set(names)) == len(names) and all(n.startswith("MIRAGE_SERVE_") for n in names)
    declared = {v.name for v in vars(knobs).values() if isinstance(v, knobs.Knob)}
    assert declared == set(names)
    text = knobs.describe()
    assert all(n in text for n in names)


def test_no_other_module_reads_the_environment():
    offenders = []
    for folder in ("mirage_serve", "patches"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "mirage_serve" / "knobs.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _READS.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "read environment variables through mirage_serve.knobs:\n" + "\n".join(offenders)
