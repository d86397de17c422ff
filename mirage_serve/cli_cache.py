"""`mirage-serve warm`, `mirage-serve cache ...` and `mirage-serve verify-demo`: thin fronts over the
kernel cache (mirage_serve.cache), the warm back end, and the superoptimizer's search + verifier.

Each back end is imported when its command runs, so a build without one still lists, benches and
reports the missing piece as one line with EXIT_UNAVAILABLE.
"""
from __future__ import annotations

import sys

from .cli_errors import EXIT_CACHE, EXIT_INCORRECT, EXIT_NO_GPU, EXIT_OK, EXIT_OOM, EXIT_UNAVAILABLE, CliError


def _cache(args):
    try:
        from .cache import KernelCache
    except ImportError as err:
        raise CliError(f"the kernel cache is not available in this build ({err})", EXIT_UNAVAILABLE) from None
    return KernelCache(args.cache_dir)


def _progress(message: str, done: int, total: int) -> None:
    print(f"warm [{done}/{total}] {message}", file=sys.stderr, flush=True)


def cmd_warm(args) -> int:
    import torch

    if args.backend == "triton" and not torch.cuda.is_available():
        raise CliError("--backend triton needs a CUDA GPU and none is visible", EXIT_NO_GPU)
    try:
        from .cache.warm import warm_model
    except ImportError as err:
        raise CliError(f"warm is not available in this build ({err})", EXIT_UNAVAILABLE) from None
    try:
        if getattr(args, "tp", 1) > 1:  # one rank's shard shapes (mirage_serve.tp.cli_tp)
            from .tp.cli_tp import warm_tp
            result = warm_tp(args, warm_model, _progress)
        else:
            result = warm_model(args.model, batch_sizes=args.batch, dtype=args.dtype, cache_dir=args.cache_dir,
                                progress=_progress, backend=args.backend, num_layers=args.layers)
    except torch.cuda.OutOfMemoryError:
        raise CliError(f"out of GPU memory while building {args.model} in {args.dtype}; try --layers 2 "
                       "(every layer has the same shapes, so the same cache keys)", EXIT_OOM) from None
    except RuntimeError as err:
        if "not available" in str(err):  # warm's own message when patch() is missing
            raise CliError(str(err), EXIT_UNAVAILABLE) from None
        raise
    print(result.summary())
    return EXIT_OK


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _print_entries(infos) -> None:
    print(f"{'layer':<8} {'ok':<3} {'size':>9} {'bins':>4}  {'created':<20} entry")
    for i in infos:
        print(f"{i.layer:<8} {'yes' if i.ok else 'NO':<3} {_size(sum(i.files.values())):>9} "
              f"{len(i.binaries):>4}  {(i.created or '-')[:19]:<20} {i.path.name}"
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
            infos = cache.verify(remove=args.remove)
            bad = [i for i in infos if not i.ok]
            _print_entries(bad)
            removed = " (bad user entries removed)" if args.remove and bad else ""
            print(f"{len(infos)} entries checked, {len(bad)} bad{removed}")
            return EXIT_CACHE if bad and not args.remove else EXIT_OK
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
    try:
        from superopt.search import superoptimize
    except ImportError as err:
        raise CliError(f"search is not available in this build ({err}); verify-demo needs "
                       "superopt.search.superoptimize", EXIT_UNAVAILABLE) from None
    try:
        from superopt.verify import check_equivalent
    except ImportError as err:
        raise CliError(f"verification is not available in this build ({err})", EXIT_UNAVAILABLE) from None
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
