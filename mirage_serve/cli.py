"""The `mirage-serve` command line: argument parsing, dispatch, and one-line errors with exit codes.

    mirage-serve models                       the registry, with parameter counts and bytes per step
    mirage-serve bench [MODEL] [options]      decode speed of patch() against HF baselines
    mirage-serve warm MODEL [options]         fill a kernel cache ahead of time
    mirage-serve cache ls|verify|clear|export FILE|import FILE
    mirage-serve verify-demo                  superoptimize RMSNorm→matmul and verify the result

Every error a user can cause ends in one line on stderr and a distinct exit code (EXIT_* below);
heavy imports (torch, transformers, the patcher) happen inside the subcommands that need them.
"""
from __future__ import annotations

import argparse
import sys

from .cli_errors import (EXIT_BAD_CHECKPOINT, EXIT_CACHE, EXIT_INCORRECT, EXIT_NO_GPU, EXIT_OK,  # noqa: F401
                         EXIT_OOM, EXIT_UNAVAILABLE, EXIT_UNKNOWN_MODEL, EXIT_USAGE, CliError)


def _int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _name_list(text: str) -> list[str]:
    from .bench import BASELINES

    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in BASELINES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown baseline {bad[0]!r}; choose from {', '.join(BASELINES)}")
    return names


def _key_value(text: str) -> tuple[str, object]:
    import json

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mirage-serve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("models", help="list the model registry (parameters, bytes read per decode step)")

    b = sub.add_parser("bench", help="decode speed of patch() against HF eager / static-compile")
    b.add_argument("model", nargs="?", help="registry name, checkpoint directory, .gguf file or hub id "
                   "(default: the embedded SmolLM2-135M, or a small random Llama)")
    b.add_argument("--batch", type=_int_list, help="batch sizes, e.g. 1,8 (GPU default 1,8; CPU 1)")
    b.add_argument("--prompt-len", type=_positive, help="prompt tokens (GPU default 128; CPU 32)")
    b.add_argument("--new-tokens", type=_positive, help="tokens generated per run (GPU default 256; CPU 8)")
    b.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="GPU default bf16; CPU fp32")
    b.add_argument("--baselines", type=_name_list,
                   help="comma list of eager,static-compile (GPU default both; CPU eager)")
    b.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto")
    b.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    b.add_argument("--layers", type=_positive, help="use only the first N decoder layers (quick runs)")
    b.add_argument("--set", dest="overrides", type=_key_value, action="append", default=[],
                   metavar="KEY=VALUE", help="override a config fact of a random-weight model "
                   "(e.g. --set hidden_size=128); repeatable")
    b.add_argument("--repeats", type=_positive, help="timed repetitions, median taken (default 3)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--cache-dir", help="kernel cache for patch() (default: MIRAGE_SERVE_CACHE_DIR or "
                   "~/.cache/mirage_serve)")
    b.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="ours without CUDA graphs or the fast decode loop: the fused kernels alone, under HF's loop")
    b.add_argument("--report", action="store_true", help="print patch()'s full per-site report")
    b.add_argument("--json", metavar="FILE", help="write the full result record as JSON")
    b.add_argument("--markdown", metavar="FILE", help="append the result as a markdown table (results files)")
    b.add_argument("--plot", metavar="FILE.png", help="draw tok/s per batch size for ours and baselines")
    b.add_argument("--tp", type=_positive, default=1, metavar="N",
                   help="tensor parallel over N GPUs (HF's tp_plan; starts itself under torchrun)")

    w = sub.add_parser("warm", help="search and compile every kernel of a model into a cache")
    w.add_argument("model", help="registry name (or its hub id), or a config.json path (file or folder)")
    w.add_argument("--batch", type=_int_list, default=[1, 2, 4, 8, 16])
    w.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="GPU default bf16; CPU fp32")
    w.add_argument("--cache-dir", help="cache directory (default: MIRAGE_SERVE_CACHE_DIR or "
                   "~/.cache/mirage_serve)")
    w.add_argument("--backend", choices=("auto", "torch", "triton"), default=None)
    w.add_argument("--layers", type=_positive, help="build only N decoder layers (same shapes, same keys)")
    w.add_argument("--tp", type=_positive, default=1, metavar="N",
                   help="the kernels of one rank of N (tensor parallel): no second GPU needed")
    w.add_argument("--cache-lengths", type=_int_list, default=[], metavar="N,N",
                   help="also choose the decode attention, at every --batch, for KV caches of these lengths (prompt + "
                        "new tokens, rounded up to 256 as generate() allocates them): what a first generate() of "
                        "each shape would otherwise spend (about a minute on an H100 host); GPU only")

    c = sub.add_parser("cache", help="inspect or move a kernel cache")
    cache_dir_help = "cache directory (default: MIRAGE_SERVE_CACHE_DIR or ~/.cache/mirage_serve)"
    c.add_argument("--cache-dir", help=cache_dir_help)
    csub = c.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions = {"ls": csub.add_parser("ls", help="list entries (user and shipped)")}
    v = actions["verify"] = csub.add_parser("verify", help="check entries, program records, symlinks, permissions "
                                            "and archives, per kind")
    v.add_argument("--remove", action="store_true", help="delete bad user entries, records and symlinks")
    v.add_argument("--archive", action="append", default=[], metavar="FILE", help="also check this tar (repeatable)")
    actions["clear"] = csub.add_parser("clear", help="delete every user-cache entry")
    actions["export"] = csub.add_parser("export", help="write good entries (μGraph text) to a tar archive")
    actions["import"] = csub.add_parser("import", help="add entries from a tar archive (verified on first use)")
    actions["export"].add_argument("file")
    actions["import"].add_argument("file")
    for a in actions.values():   # after the verb as well (`cache ls --cache-dir D`), as warm and bench take it
        a.add_argument("--cache-dir", default=argparse.SUPPRESS, help=cache_dir_help)

    sub.add_parser("verify-demo", help="superoptimize RMSNorm→matmul and verify the fused μGraph")
    return parser


def cmd_models(args) -> int:
    from . import registry

    header = f"{'name':<17} {'family':<12} {'layers':>6} {'hidden':>6} {'heads':>7} {'params':>8} " \
             f"{'GB/step':>8}  hub id"
    print(header)
    print("-" * len(header))
    for e in registry.entries():
        c = e.config
        heads = f"{c['num_attention_heads']}/{c.get('num_key_value_heads', c['num_attention_heads'])}"
        params = registry.param_count(c)
        size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
        print(f"{e.name:<17} {e.model_type:<12} {c['num_hidden_layers']:>6} {c['hidden_size']:>6} "
              f"{heads:>7} {size:>8} {registry.decode_bytes(c) / 1e9:>8.2f}  {e.hub_id}")
    print("GB/step: weights read per decode step in bf16 (all layers + lm_head); heads: query/kv")
    return EXIT_OK


def _dispatch(args) -> int:
    if args.command == "models":
        return cmd_models(args)
    if args.command == "bench":
        from .cli_bench import cmd_bench

        return cmd_bench(args)
    from . import cli_cache

    handlers = {"warm": cli_cache.cmd_warm, "cache": cli_cache.cmd_cache,
                "verify-demo": cli_cache.cmd_verify_demo}
    return handlers[args.command](args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in result files
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from .registry import UnknownModelError

    try:
        return _dispatch(args)
    except CliError as err:
        print(f"mirage-serve: error: {err}", file=sys.stderr)
        return err.code
    except UnknownModelError as err:
        print(f"mirage-serve: error: {err}", file=sys.stderr)
        return EXIT_UNKNOWN_MODEL
    except KeyboardInterrupt:
        print("mirage-serve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
