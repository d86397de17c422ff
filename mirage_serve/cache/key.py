"""The cache key: what a kernel depends on (program, shape bucket, dtype, arch, backend, toolchain).

The digest covers every field except ``label``, which only makes the directory name readable
(``rmsnorm_matmul-sm90-bf16-k4096-n6144-1a2b3c4d``): keys that differ only in label share a
digest but name different directories.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# Toolchain components whose version can change what a cache entry holds. Binaries depend on all
# of them; the shipped, binary-free cache is keyed by TEXT_VERSIONS alone, so it serves users on
# any torch/triton/CUDA (and its μGraphs are re-verified on load by patch() anyway).
# (name, distributions to try).
_DISTRIBUTIONS = (
    ("triton", ("triton",)),
    ("torch", ("torch",)),
)
TEXT_VERSIONS = ("superopt",)

_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.+-]")
_LABEL_MAX = 96


def versions_now() -> tuple[tuple[str, str], ...]:
    """(name, version) for superopt, triton and torch, where installed. Read from package
    metadata: nothing heavy is imported. (Kernels are compiled by triton's own bundled ptxas, so
    triton's version covers them.)"""
    import superopt

    out = [("superopt", superopt.__version__), ("superopt-src", _superopt_source_digest())]
    for name, dists in _DISTRIBUTIONS:
        for dist in dists:
            try:
                out.append((name, metadata.version(dist)))
                break
            except metadata.PackageNotFoundError:
                continue
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _superopt_source_digest() -> str:
    """sha256[:12] over superopt's Python sources: in a development tree the package version stays
    0.1.0 while codegen changes, and a binary built by older codegen must not be reused."""
    import superopt

    root = Path(superopt.__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class CacheKey:
    program_digest: str          # digest of the canonical Lax program text
    bucket: str                  # shape bucket, e.g. "b8" or "b1-16"
    dtype: str                   # "bf16", "fp16", "fp32"
    arch: str                    # "sm90", or "cpu" for the interpreter backend
    backend: str                 # "triton", "torch"
    versions: tuple[tuple[str, str], ...]
    label: str                   # readable directory prefix only

    def __post_init__(self):
        # Accept lists (as JSON gives them) but store the hashable, canonical tuple form.
        vs = tuple((str(n), str(v)) for n, v in self.versions)
        object.__setattr__(self, "versions", vs)
        for f in ("program_digest", "bucket", "dtype", "arch", "backend"):
            if not isinstance(getattr(self, f), str) or not getattr(self, f):
                raise ValueError(f"CacheKey.{f} must be a non-empty string")

    def fields(self) -> dict:
        """The key as a JSON-ready dict (meta.json stores it; `from_fields` reads it back)."""
        return {
            "program_digest": self.program_digest, "bucket": self.bucket, "dtype": self.dtype,
            "arch": self.arch, "backend": self.backend,
            "versions": [list(p) for p in self.versions], "label": self.label,
        }

    @classmethod
    def from_fields(cls, d: dict) -> "CacheKey":
        if not isinstance(d, dict) or set(d) != set(cls.__dataclass_fields__):
            raise ValueError(f"key fields malformed: {d!r}")
        vs = d["versions"]
        if not isinstance(vs, list) or not all(isinstance(p, list) and len(p) == 2 for p in vs):
            raise ValueError(f"key versions malformed: {vs!r}")
        return cls(**{**d, "versions": tuple(tuple(p) for p in vs)})

    def digest(self) -> str:
        """Full sha256 hex of the canonical JSON of every field but the label."""
        d = self.fields()
        del d["label"]
        blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def dirname(self) -> str:
        label = _LABEL_BAD.sub("_", self.label)[:_LABEL_MAX].strip(".-+") or "kernel"
        return f"{label}-{self.digest()[:8]}"

    def for_shipped(self) -> "CacheKey":
        """The key of this kernel's binary-free entry: versions cut to those text depends on."""
        vs = tuple(p for p in self.versions if p[0] in TEXT_VERSIONS)
        return CacheKey(self.program_digest, self.bucket, self.dtype, self.arch, self.backend,
                        vs, self.label)
