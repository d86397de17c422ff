"""`mirage-serve warm`, `mirage-serve cache ...` and `mirage-serve verify-demo`: thin fronts over the
kernel cache (mirage_serve.cache), the warm back end, and the superoptimizer's search + verifier.

Each back end is imported when its command runs, so a command that does not need torch (or the
search) does not pay for importing it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .cli_errors import (EXIT_BAD_CHECKPOINT, EXIT_CACHE, EXIT_INCORRECT, EXIT_NO_GPU, EXIT_OK, EXIT_OOM, EXIT_USAGE,
                         CliError)


def _cache(args):
    from .cache import KernelCache

    return KernelCache(args.cache_dir)


def _progress(message: str, done: int, total: int) -> None:
    print(f"warm [{done}/{total}] {message}", file=sys.stderr, flush=True)


def check_warm_model(spec: str) -> None:
    """A warm MODEL that resolve_config would refuse, refused before torch is imported: a config
    path that is not there, or a name that is neither a registry name nor a registry hub id."""
    from . import registry

    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CliError(f"directory {path} has no config.json", EXIT_BAD_CHECKPOINT)
        return
    if path.suffix == ".json" or spec.startswith((".", "/", "~")):
        if not path.is_file():
            raise CliError(f"no such config file: {spec}", EXIT_BAD_CHECKPOINT)
        return
    if not any(e.hub_id.lower() == spec.lower() for e in registry.entries()):
        registry.get(spec)  # UnknownModelError with the closest names


def cmd_warm(args) -> int:
    check_warm_model(args.model)
    import torch

    has_gpu = torch.cuda.is_available()
    if args.backend == "triton" and not has_gpu:
        raise CliError("--backend triton needs a CUDA GPU and none is visible", EXIT_NO_GPU)
    # bf16 is what GPU serving runs; on a CPU (the torch executor) fp32 is the dtype that is exact
    # enough to check against and fast enough to build.
    dtype = args.dtype or ("bf16" if has_gpu else "fp32")
    from .cache.warm import cache_capacities, warm_model

    lengths = getattr(args, "cache_lengths", [])
    if lengths and getattr(args, "tp", 1) > 1:
        raise CliError("--cache-lengths is not supported with --tp yet: each rank chooses its decode attention on "
                       "its first decode step of a shape; drop one of the two", EXIT_USAGE)
    try:
        cache_capacities(lengths)
    except ValueError as e:
        raise CliError(f"--cache-lengths: {e}", EXIT_USAGE) from None
    try:
        if getattr(args, "tp", 1) > 1:  # one rank's shard shapes (mirage_serve.tp.cli_tp)
            from .tp.cli_tp import warm_tp
            result = warm_tp(args, warm_model, _progress, dtype)
        else:
            result = warm_model(args.model, batch_sizes=args.batch, dtype=dtype, cache_dir=args.cache_dir,
                                progress=_progress, backend=args.backend, num_layers=args.layers,
                                cache_lengths=lengths)
    except torch.cuda.OutOfMemoryError:
        raise CliError(f"out of GPU memory while building {args.model} in {dtype}; try --layers 2 "
                       "(every layer has the same shapes, so the same cache keys)", EXIT_OOM) from None
    print(result.summary())
    return EXIT_OK


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _print_entries(infos) -> None:
    # signed: written by this user's own process (its binaries load, its verdict is believed);
    # anything else is verified against the site's program on first use
    print(f"{'layer':<8} {'ok':<3} {'signed':<6} {'size':>9} {'bins':>4}  {'created':<20} entry")
    for i in infos:
        print(f"{i.layer:<8} {'yes' if i.ok else 'NO':<3} {'yes' if i.signed else 'no':<6} "
              f"{_size(sum(i.files.values())):>9} {len(i.binaries):>4}  {(i.created or '-')[:19]:<20} {i.path.name}"
              + ("" if i.ok else f"  ({i.reason})"))


def cmd_cache(args) -> int:
    cache = _cache(args)
    try:
        if args.action == "ls":
            infos = cache.ls()
            _print_entries(infos)
            print(f"{len(infos)} entries; user cache {cache.root}"
                  + (f", shipped {cache.shipped}" if cache.shipped else ""))
            return EXIT_OK
        if args.action == "verify":
            from .cache.audit import audit

            result = audit(cache, archives=args.archive, remove=args.remove)
            for f in result.findings:
                print(f.line())
            print(result.summary())
            removed = " (bad user-cache items removed)" if args.remove and result.bad else ""
            print(f"cache {cache.root}: {len(result.bad)} bad{removed}")
            return EXIT_CACHE if result.bad and not args.remove else EXIT_OK
        if args.action == "clear":
            print(f"removed {cache.clear()} entries from {cache.root}")
            return EXIT_OK
        if args.action == "export":
            print(f"exported {cache.export(args.file)} entries to {args.file}")
            return EXIT_OK
        print(f"imported {cache.import_(args.file)} entries from {args.file} into {cache.root}")
        return EXIT_OK
    except PermissionError as err:
        raise CliError(str(err), EXIT_CACHE) from None
    except (OSError, ValueError) as err:  # a missing or malformed archive, a bad entry in it
        raise CliError(f"cache {args.action} failed: {err}", EXIT_CACHE) from None


def demo_program():
    """RMSNorm(x) · W with small odd shapes: x [3, 96], W [96, 80]."""
    from superopt.lax import Program

    p = Program("rmsnorm_matmul")
    x = p.input("x", (3, 96))
    w = p.input("w", (96, 80))
    p.output(p.matmul(p.rms_norm(x, eps=1e-6), w))
    return p.build()


def verdict_line(verdict) -> str:
    """One line with the verdict, its trials and its error bound (whatever names the Verdict uses)."""
    parts = [str(verdict).splitlines()[0] if str(verdict) else type(verdict).__name__]
    for name in ("trials", "bound", "error_bound"):
        value = getattr(verdict, name, None)
        if value is not None and name.replace("_", " ") not in parts[0]:
            parts.append(f"{name.replace('_', ' ')} {value}")
    return "; ".join(parts)


def _equivalent(verdict) -> bool:
    for name in ("equivalent", "ok"):
        if hasattr(verdict, name):
            return bool(getattr(verdict, name))
    return bool(verdict)


def cmd_verify_demo(args) -> int:
    program = demo_program()
    from superopt.search import superoptimize
    from superopt.verify import check_equivalent

    print("program: RMSNorm(x [3, 96]) · W [96, 80]; searching for a fused μGraph ...", file=sys.stderr)
    found = superoptimize(program)
    ugraph = getattr(found, "best", None)
    if ugraph is None:
        raise CliError("search found no μGraph for RMSNorm→matmul", EXIT_INCORRECT)
    stats = getattr(found, "stats", None)
    if stats is not None:
        print(f"search: {len(getattr(found, 'ranked', []))} verified μGraphs from "
              f"{getattr(stats, 'patterns', '?')} patterns, {getattr(stats, 'states', '?')} states, "
              f"{sum(getattr(stats, 'seconds', {}).values()):.2f} s; best has "
              f"{len(getattr(ugraph, 'nodes', ()))} kernel op(s)")
    verdict = check_equivalent(program, ugraph)
    print(f"verdict: {verdict_line(verdict)}")
    return EXIT_OK if _equivalent(verdict) else EXIT_INCORRECT
