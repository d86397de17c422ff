"""The file format of a traced site program (``programs/<fingerprint>.json``), without torch.

A record is ``{"format": 1, "sha256": <of the canonical JSON of body>, "body": {"text": μGraph text,
"digest": its digest, "sources": [[kind, ref], ...]}}``. ``programs.py`` writes and reads them for
patch(); ``archive.py`` checks them when a cache is exported or imported.
"""
from __future__ import annotations

import hashlib
import json
import re

FORMAT = 1
NAME = re.compile(r"^[0-9a-f]{64}\.json$")   # <sha256 fingerprint>.json
MAX_BYTES = 1 << 20


def encode(body: dict) -> bytes:
    return json.dumps({"format": FORMAT, "sha256": _hash(body), "body": body}).encode()


def decode(raw: bytes) -> dict:
    """The record's body; ValueError if it is malformed or its hash does not match."""
    try:
        rec = json.loads(raw)
        body = rec["body"]
        ok = rec.get("format") == FORMAT and _hash(body) == rec["sha256"]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed record ({type(e).__name__}: {e})") from None
    if not ok:
        raise ValueError("format or content hash does not match")
    return body


def _hash(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
