"""`mirage-serve cache verify`: check everything a cache directory holds, and archives, by kind.

Kinds of finding (each ``bad``, which fails the command, or ``warn``):

* ``entry``: an entry that does not load (hash, format, key) or that claims more trust than it has
  (``store._trusted_form``: a MAC that does not check, binaries in an unsigned entry);
* ``program``: a traced program record (``programs/*.json``) that is damaged (a flipped byte, a
  truncation), a symlink, or not signed by this user (``records.py``);
* ``symlink``: any symlink anywhere under the cache root (the cache never follows one);
* ``permissions``: a cache directory that is group- or world-writable, or owned by someone else
  (others can plant files: they are never run or believed, but they cost a rebuild) — a warning;
* ``archive``: a tar file given to check before ``cache import``: unsafe members refuse it whole,
  entries that would be rejected are bad, binaries / sources / program records it carries (which
  an import drops) are warnings.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from superopt.ir import digest, from_text

from . import records
from .archive import stage
from .entry import BadEntry, read_entry
from .files import PROGRAMS_DIR, SymlinkError, discard_entry, read_file, real_dir
from .store import KernelCache

KINDS = ("entry", "program", "symlink", "permissions", "archive")


@dataclass(frozen=True)
class Finding:
    kind: str        # one of KINDS
    path: Path
    problem: str
    bad: bool = True  # False: a warning only

    def line(self) -> str:
        return f"{'BAD ' if self.bad else 'warn'} {self.kind:<11} {self.path}: {self.problem}"


@dataclass
class Audit:
    findings: list[Finding]
    checked: dict[str, int]   # kind -> how many things of that kind were looked at

    @property
    def bad(self) -> list[Finding]:
        return [f for f in self.findings if f.bad]

    def summary(self) -> str:
        """One line per kind: checked, bad, warnings."""
        out = []
        for kind in KINDS:
            mine = [f for f in self.findings if f.kind == kind]
            nbad = sum(f.bad for f in mine)
            out.append(f"{kind + ':':<13}{self.checked.get(kind, 0):5} checked, {nbad} bad, "
                       f"{len(mine) - nbad} warnings")
        return "\n".join(out)


def audit(cache: KernelCache, layers: tuple[str, ...] = ("user", "shipped"), archives=(),
          remove: bool = False) -> Audit:
    """Check `cache` (and the tar files `archives`). `remove`: delete the bad user-cache things
    (entries, records, symlinks — a link itself, never its target)."""
    findings: list[Finding] = []
    checked: dict[str, int] = {}
    rows = cache.verify(layers)
    checked["entry"] = len(rows)
    findings += [Finding("entry", r.path, r.reason) for r in rows if not r.ok]
    if "user" in layers and cache.root.is_dir():
        findings += _programs(cache, checked)
        findings += _links_and_modes(cache.root, checked)
    for a in archives:
        findings += _archive(Path(a), checked)
    if remove:
        cache._require_writable("verify --remove")
        for f in findings:
            if f.bad and f.kind != "archive" and _inside(f.path, cache.root):
                if f.kind == "entry" and real_dir(f.path):
                    discard_entry(cache.root, f.path)
                elif os.path.lexists(f.path) and not real_dir(f.path):
                    f.path.unlink()
    return Audit(findings, checked)


def _inside(path: Path, root: Path) -> bool:
    return path.parent == root or root in path.parents


def _programs(cache: KernelCache, checked: dict) -> list[Finding]:
    folder = cache.root / PROGRAMS_DIR
    if not real_dir(folder):
        return []   # a programs/ that is a link is reported with the symlinks
    out = []
    for f in sorted(folder.iterdir()):
        checked["program"] = checked.get("program", 0) + 1
        if not records.NAME.match(f.name):
            out.append(Finding("program", f, "not a program record (stray file)", bad=not f.name.endswith(".tmp")))
            continue
        try:
            body = records.decode(read_file(f, records.MAX_BYTES), cache.secret, signed=True)
            if digest(from_text(body["text"])) != body["digest"]:
                raise ValueError("the program text does not parse to its recorded digest")
        except SymlinkError as e:
            out.append(Finding("program", f, str(e)))
        except (ValueError, KeyError, TypeError, OSError) as e:
            out.append(Finding("program", f, str(e)))
    return out


def _links_and_modes(root: Path, checked: dict) -> list[Finding]:
    out = []
    me = os.getuid()
    for here, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(here) / name
            checked["symlink"] = checked.get("symlink", 0) + 1
            if p.is_symlink():
                out.append(Finding("symlink", p, f"symlink to {os.readlink(p)!r}: refused (never followed)"))
        st = os.lstat(here)
        checked["permissions"] = checked.get("permissions", 0) + 1
        if st.st_mode & 0o022:
            out.append(Finding("permissions", Path(here), f"mode {stat.S_IMODE(st.st_mode):04o} is group- or "
                               "world-writable: others can plant entries (never run or believed, but rebuilt)",
                               bad=False))
        if st.st_uid != me:
            out.append(Finding("permissions", Path(here), f"owned by uid {st.st_uid}, not this user", bad=False))
    return out


def _archive(path: Path, checked: dict) -> list[Finding]:
    checked["archive"] = checked.get("archive", 0) + 1
    tmp = Path(tempfile.mkdtemp(prefix="mirage-serve-audit."))
    try:
        try:
            stage(path, tmp)
        except (ValueError, OSError) as e:
            return [Finding("archive", path, f"refused whole: {e}")]
        out = []
        for d in sorted(tmp.iterdir()):
            if d.name == PROGRAMS_DIR:
                n = len(list(d.iterdir()))
                out.append(Finding("archive", path, f"{n} program records (an import drops them)", bad=False))
                continue
            try:
                _, entry = read_entry(d)
            except (BadEntry, OSError) as e:
                out.append(Finding("archive", path, f"entry {d.name}: {e}"))
                continue
            extra = sorted(set(entry.sources) | set(entry.binaries))
            if extra:
                out.append(Finding("archive", path, f"entry {d.name} carries {', '.join(extra)} (an import "
                                   "drops them)", bad=False))
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
