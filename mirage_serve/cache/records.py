"""The file format of a traced site program (``programs/<fingerprint>.json``), without torch.

A record is ``{"format": 2, "sha256": <of the canonical JSON of body>, "mac": <HMAC of the same
under this user's secret>, "body": {"text": μGraph text, "digest": its digest, "sources": [[kind,
ref], ...]}}``. The hash catches damage (a flipped byte, a truncation); the MAC (``trust.py``) says
this user's own patch() traced it. A record is believed only when both check: the program it
holds is what a site is verified against, so a forged one would make a wrong kernel look
equivalent. ``programs.py`` writes and reads them for patch(); ``audit.py`` checks them for
``mirage-serve cache verify``.
"""
from __future__ import annotations

import hashlib
import json
import re

from . import trust

FORMAT = 2
NAME = re.compile(r"^[0-9a-f]{64}\.json$")   # <sha256 fingerprint>.json
MAX_BYTES = 1 << 20


def encode(body: dict, secret: bytes | None) -> bytes:
    """The record's bytes, signed when ``secret`` is given."""
    rec = {"format": FORMAT, "sha256": _hash(body), "body": body}
    if secret is not None:
        rec["mac"] = trust.mac(secret, trust.RECORD, _canonical(body))
    return json.dumps(rec).encode()


def decode(raw: bytes, secret: bytes | None = None, signed: bool = False) -> dict:
    """The record's body; ValueError if it is malformed, its hash does not match, or (``signed``)
    its MAC does not check under ``secret``."""
    try:
        rec = json.loads(raw)
        body = rec["body"]
        ok = rec.get("format") == FORMAT and _hash(body) == rec["sha256"]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed record ({type(e).__name__}: {e})") from None
    if not ok:
        raise ValueError("format or content hash does not match")
    if signed and not trust.signed(secret, trust.RECORD, _canonical(body), rec.get("mac")):
        raise ValueError("not signed by this user (MAC missing or wrong)")
    return body


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _hash(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
