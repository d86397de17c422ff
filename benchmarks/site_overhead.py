"""Host (CPU) cost of a patched decode step without CUDA graphs, and where it goes.

    python benchmarks/site_overhead.py Qwen2.5-0.5B --layers 4 [--batch 1] [--profile 30]

Kernels alone (patch(cuda_graphs=False)) are launched by Python on every step, so at decode sizes a
site's cost is its host path, not its kernel: this prints, per distinct site program, the host µs of
one call of our site runtime next to the host µs of the eager modules it replaces (the norm and its
consumers, or the projection), then the ms of whole decode steps (ours and eager alternating for
--rounds rounds; with all layers, --layers 0, that is the model's decode step) and, with
--profile N, the top of a cProfile of N patched steps. Host time = wall time of many calls queued
without a sync (the GPU, idle at these sizes, keeps up), divided by the number of calls.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _host_us(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    _sync()
    return t / calls * 1e6


def _eager_site(layer, site):
    """The eager work a site replaces, on the layer's original modules (patched forwards bypassed)."""
    from mirage_serve.patching.sites import NormSite

    def call(mod, x):
        return type(mod).forward(mod, x)

    if isinstance(site, NormSite):
        norm = layer.get_submodule(site.norm)
        consumers = [(layer.get_submodule(c.path), c.tail) for c in site.consumers]

        def run(x):
            n = call(norm, x)
            for mod, tail in consumers:
                if tail:  # the site computes the consumer without its tail (a separate site)
                    mod_tail = mod.get_submodule(tail)
                    y = _without_tail(mod, mod_tail, n)
                else:
                    y = call(mod, n)
            return y
        return run
    proj = layer.get_submodule(site.proj)
    return lambda x: call(proj, x)


def _without_tail(mod, tail, n):
    """An MLP's gate/up/act part: its forward with the tail (down_proj) replaced by identity."""
    saved = tail.forward
    tail.forward = lambda y: y
    try:
        return type(mod).forward(mod, n)
    finally:
        tail.forward = saved


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers to build (0: all)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--profile", type=int, default=30, help="patched decode steps to cProfile (0: none)")
    ap.add_argument("--rounds", type=int, default=1, help="alternating ours / eager decode timings")
    ap.add_argument("--sites", action=argparse.BooleanOptionalAction, default=True,
                    help="time each site of one layer (--no-sites: the decode steps only)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (torch backend)")
    args = ap.parse_args(argv)

    import mirage_serve
    from mirage_serve.patching import install, pipeline
    from mirage_serve.bench_load import load
    from mirage_serve.hf_names import CACHE_KWARG, output_cache

    lm = load(args.model, dtype="bf16" if args.device == "cuda" else "fp32", device=args.device,
              layers=args.layers or None)
    args.layers = lm.model.config.num_hidden_layers
    model = lm.model
    installed = []
    original_install = install.install

    def recording_install(layer, site, runtime, records, *slot):
        installed.append((layer, site, runtime))
        original_install(layer, site, runtime, records, *slot)

    pipeline.install = recording_install
    try:
        report = mirage_serve.patch(model, cuda_graphs=False, batch_sizes=(args.batch,),
                                    search_budget=None if args.device == "cuda" else 0)
    finally:
        pipeline.install = original_install
    print(str(report).splitlines()[-1])

    hidden = model.config.hidden_size
    x = torch.randn(args.batch, 1, hidden, device=args.device, dtype=model.dtype)
    if args.sites:
        print(f"\n{lm.name}, batch {args.batch}: host µs per call (one layer's sites)")
        print(f"{'site':12} {'ours':>8} {'eager':>8}  program kernels / library ops")
    layer0 = installed[0][0]
    with torch.inference_mode():
        for layer, site, runtime in installed:
            if layer is not layer0 or not args.sites:
                continue
            xs = x if getattr(runtime, "dim", hidden) == hidden else torch.randn(
                args.batch, 1, runtime.dim, device=args.device, dtype=model.dtype)
            ours = _host_us(lambda: runtime.run(xs))
            eager = _host_us(lambda: _eager_site(layer, site)(xs))
            print(f"{site.name:12} {ours:8.1f} {eager:8.1f}  {_shape_of(runtime)}")

        ids = torch.randint(1, lm.facts["vocab_size"], (args.batch, 32), device=args.device)

        def decode(n: int) -> float:
            """ms per step of n decode steps after a fresh prefill (lengths 33..32+n), wall time
            with one sync at the end: host time where the host is the bottleneck, else GPU time."""
            out = model(ids, use_cache=True)
            past, tok = output_cache(out), out.logits[:, -1:].argmax(-1)
            _sync()
            t0 = time.perf_counter()
            for _ in range(n):
                past = output_cache(model(tok, use_cache=True, **{CACHE_KWARG: past}))
            _sync()
            return (time.perf_counter() - t0) / n * 1e3

        # Each timed run follows an untimed one over the same cache lengths: SDPA's first call at a
        # new KV length can cost ms of host time (kernel plans). Ours and eager alternate for
        # --rounds rounds (patch() and unpatch() in between), so a drifting machine hits both.
        steps: dict[str, list[float]] = {"ours": [], "eager": []}
        prof = None
        for r in range(args.rounds):
            if r:
                mirage_serve.patch(model, cuda_graphs=False, batch_sizes=(args.batch,))
            for label in ("ours", "eager"):
                decode(60)
                steps[label].append(decode(60))
                if label == "ours":
                    if args.profile and prof is None:
                        prof = cProfile.Profile()
                        prof.enable()
                        decode(args.profile)
                        prof.disable()
                    mirage_serve.unpatch(model)
        ours, eager = statistics.median(steps["ours"]), statistics.median(steps["eager"])
        print(f"\ndecode step ms ({args.layers} layers, median of {args.rounds} alternating rounds; each round: "
              f"ours {' '.join(f'{t:.2f}' for t in steps['ours'])}, eager {' '.join(f'{t:.2f}' for t in steps['eager'])}): "
              f"ours {ours:.3f}, eager {eager:.3f}, ours/eager {ours / eager:.2f} (eager/ours {eager / ours:.2f}x); "
              f"per layer ours {ours / args.layers * 1e3:.0f} µs, eager {eager / args.layers * 1e3:.0f} µs")
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
        print(s.getvalue())


def _shape_of(runtime) -> str:
    parts = getattr(runtime, "parts", None) or [(runtime, ())]
    out = []
    for rt, _ in parts:
        for bk in rt.kernels.values():
            g = getattr(bk.executor.run, "graph", None)
            if g is None:
                out.append("?")
                continue
            kernels = sum(n.op == "customized" for n in g.nodes)
            lib = sum(n.op not in ("customized", "reshape", "transpose", "slice", "const") for n in g.nodes)
            out.append(f"{kernels}k/{lib}lib")
    return " + ".join(out)


if __name__ == "__main__":
    main()
