"""Issue 29's question before any decode-loop work: do a patched model's site kernels run faster as one launch?

    python benchmarks/probe_persistent_layers.py Qwen2.5-0.5B --batch 1 [--layers 0] [--programs 1,2]

Patches the model (its shipped, searched site kernels; kernels alone, no CUDA graphs of the decode loop), records
the compiled-graph calls of one decode step on HF's static cache (``superopt.runtime.compiled.recording``: every
site kernel of every layer and the final norm, and a mark where the hand-written decode attention ran; the
attention and lm_head are in no arm, and keep the values the recorded step left in their outputs), and times, each
captured in a CUDA graph and replayed:

- ``launches``: those calls one by one, as the decode step launches them (programmatic dependent launch where the
  device has it), so the kernel count is the step's less its attention, lm_head and loop kernels;
- ``whole xK``: the same kernels as one persistent launch (``superopt.runtime.persistent``) of K programs per SM,
  a task a block of the kernels' own grids (its counters reset by its own last program, so one graph node a launch);
- ``each xK``: one persistent launch per site call, so as many launches as ``launches`` and no wait between two
  calls: against ``launches`` it prices running the bodies in the persistent loop (tables, ticket, one program's
  registers for all bodies), against ``whole`` what the launch boundaries cost;
- ``segments xK``: one persistent launch per run of site calls between two decode-attention launches (o_proj +
  residual, gate/up, down + residual, the next layer's q/k/v): the launches a decode loop with persistent segments
  would make, less the attention's;
- ``.../cC``: each launch cut into at most C tasks a program, of consecutive blocks (``tasks_per_launch``);
- ``... +pf``: each with its tasks asking L2 for their share of the weights before they wait
  (``PersistentRun(prefetch=True)``).

Both arms run the same block bodies on the same weights, in alternating rounds; the table gives µs per step and the
weights' bytes over that time as % of the copy bandwidth measured in the same run. The persistent runs'
outputs (every buffer a kernel writes, as the step leaves it) are checked against the launches' at the dtype's
tolerance: the order of float atomic adds differs.
Session 34's runs and what they say: benchmarks/results/floor_h100_2026-11-27_s34/README.md, docs/persistent.md.
"""
from __future__ import annotations

import argparse
import statistics

TOL = {"bfloat16": 1e-2, "float16": 2e-3}  # docs/conventions.md tolerance table


def record_step(model, batch: int, vocab: int) -> list:
    """The compiled-graph calls of one decode step of the patched ``model`` at ``batch`` rows, with a mark where
    the decode attention ran (HF's static cache, so the attention kernels take the step; no torch.compile)."""
    import torch

    from superopt.runtime.compiled import recording

    device = next(model.parameters()).device
    ids = torch.randint(1, vocab, (batch, 16), generator=torch.Generator().manual_seed(0)).to(device)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2, do_sample=False,
              pad_token_id=0, cache_implementation="static", disable_compile=True)
    with torch.inference_mode():
        model.generate(ids, **kw)  # the first decode step checks each attention module against its own forward
        with recording() as calls:  # the prefill runs the original modules: not recorded
            model.generate(ids, **kw)
    return calls


def written_buffers(calls) -> dict:
    """{address: tensor} of every buffer the calls' kernels write (outputs, workspaces, counters)."""
    return {t.data_ptr(): t for cg, inputs in calls for spec, ts in cg.kernel_launches(*inputs)[0]
            for t in ts[len(spec.args):]}


def weight_bytes(calls) -> int:
    """Bytes of the tensors the calls read that none of them writes (the weights, and the attention's output)."""
    written = written_buffers(calls)
    seen = {}
    for _, inputs in calls:
        for t in inputs:
            if t.data_ptr() not in written:
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def captured(fn):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def replay_us(graph, n: int = 200) -> float:
    import torch

    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def largest_err(outs: dict, want: dict) -> float:
    return max(float((outs[p].double() - w.double()).norm() / w.double().norm().clamp_min(1e-30))
               for p, w in want.items())


def check_replays(arms: dict, outs: dict, want: dict, tol: float, n: int) -> None:
    """Replays each arm ``n`` times, synchronising and checking the written buffers after each: a race between
    programs shows as a replay that fails where the first passed."""
    import torch

    for name, graph in arms.items():
        worst = 0.0
        for i in range(n):
            graph.replay()
            torch.cuda.synchronize()
            err = largest_err(outs, want)
            worst = max(worst, err) if err == err else float("inf")
            if not err <= tol:
                print(f"{name}: replay {i + 1} of {n}: largest rel err {err:.2e} (FAILED, tolerance {tol})")
                break
        else:
            print(f"{name}: {n} replays, largest rel err {worst:.2e} (OK, tolerance {tol})")


def main(argv=None) -> None:
    import torch

    import mirage_serve
    from mirage_serve.bench_load import load
    from mirage_serve.options import PatchOptions
    from superopt.runtime.persistent import PersistentRun, segments
    from superopt.runtime.timing import copy_bandwidth

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=0, help="cut the model to this many layers (0: all)")
    ap.add_argument("--programs", default="1,4,8", help="persistent programs per SM")
    ap.add_argument("--tasks", default="0,1",
                    help="tasks a launch is cut into, per program (0: a task a block, the kernels' own grids)")
    ap.add_argument("--prefetch", default="0", help="0, 1 or 0,1: without / with the L2 prefetch of the weights")
    ap.add_argument("--warps", type=int, default=0, help="warps a program (0: the most any body's kernel asks)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arms", default="", help="comma-separated arm names to build (default: all)")
    ap.add_argument("--check", type=int, default=0,
                    help="replay each arm this many times, checking its outputs after each, instead of timing")
    args = ap.parse_args(argv)

    bw = copy_bandwidth()
    lm = load(args.model, dtype="bf16", device="cuda", layers=args.layers or None)
    print(mirage_serve.patch(lm.model, batch_sizes=(args.batch,), cuda_graphs=False,
                             options=PatchOptions(attention="hand-written")))
    recorded = record_step(lm.model, args.batch, lm.facts["vocab_size"])
    parts = segments(recorded)  # the site calls between two decode-attention launches
    calls = [c for part in parts for c in part]
    launches = sum(len(cg.kernel_launches(*inputs)[0]) for cg, inputs in calls)
    nbytes = weight_bytes(calls)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{lm.name} b{args.batch}, {lm.facts['num_hidden_layers']} layers: {len(calls)} site calls, {launches} "
          f"kernels in {len(parts)} segments between attention launches, {nbytes / 1e6:.1f} MB read that no kernel "
          f"writes; {torch.cuda.get_device_name()}, {sms} SMs, copy {bw / 1e12:.2f} TB/s")

    def one_by_one():
        for cg, inputs in calls:
            cg(*inputs)
    arms = {"launches": captured(one_by_one)}
    # a captured graph holds the runs' device tables by address only: each arm's runs live as long as its graph
    # (session 34's first run freed them, and the next arm's tables took their memory)
    kept = {}
    arms["launches"].replay()
    torch.cuda.synchronize()
    outs = {p: t for p, t in written_buffers(calls).items()
            if t.dtype in (torch.bfloat16, torch.float16)}  # not the float32 workspaces or the counters
    want = {p: t.clone() for p, t in outs.items()}
    tol = TOL[str(lm.model.dtype).removeprefix("torch.")]
    for k, per, pf in ((int(k), int(c), bool(int(f))) for k in args.programs.split(",")
                       for c in args.tasks.split(",") for f in args.prefetch.split(",")):
        # one launch for the whole step's site kernels, and one a segment (what the decode loop could run, with
        # the attention launched between segments); "/cC": each launch cut into at most C tasks a program of several
        # blocks; "+pf": each task asks L2 for its share of the weights first
        tag = f"x{k}{f'/c{per}' if per else ''}{' +pf' if pf else ''}"
        for name, parts_of_arm in ((f"whole {tag}", [calls]), (f"segments {tag}", parts),
                                   (f"each {tag}", [[c] for c in calls])):
            if args.arms and name not in args.arms.split(","):
                continue
            try:  # an arm that does not build is reported, and the others still run
                runs = [PersistentRun(part, programs=k * sms, prefetch=pf, num_warps=args.warps or None,
                                      tasks_per_launch=per * k * sms or None) for part in parts_of_arm]

                def persistent(runs=runs):
                    for run in runs:
                        run()
                arms[name], kept[name] = captured(persistent), runs
                arms[name].replay()
                torch.cuda.synchronize()
            except Exception as e:  # (a fault that kills the CUDA context ends the probe anyway)
                arms.pop(name, None)
                print(f"{name}: did not run: {type(e).__name__}: {str(e)[:400]}")
                continue
            err = largest_err(outs, want)
            ck = runs[0].compiled
            print(f"{name}: {len(runs)} launches of {runs[0].programs} programs, {sum(r.tasks for r in runs)} tasks, "
                  f"{runs[0].num_warps} warps, {getattr(ck, 'n_regs', '?')} registers, "
                  f"{getattr(ck, 'n_spills', '?')} spills, {getattr(getattr(ck, 'metadata', None), 'shared', '?')} B "
                  f"shared; largest rel err of the {len(want)} buffers written {err:.2e} against "
                  f"the launches' ({'OK' if err <= tol else 'FAILED'}, tolerance {tol})")
    if args.check:
        check_replays(arms, outs, want, tol, args.check)
        return
    times = {name: [] for name in arms}
    for _ in range(args.rounds):  # alternating: drift between arms cancels
        for name, graph in arms.items():
            times[name].append(replay_us(graph))
    base = statistics.median(times["launches"])
    print(f"\n{'arm':<16} {'µs/step':>9} {'× launches':>11} {'% copy':>7}")
    for name, ts in times.items():
        us = statistics.median(ts)
        print(f"{name:<16} {us:>9.1f} {base / us:>10.2f}x {100 * nbytes / (us * 1e-6) / bw:>6.0f}%")


if __name__ == "__main__":
    main()
