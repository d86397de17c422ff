"""Tensor-parallel decode on 2 GPUs (issue 30, must-show 2): ours TP=2 vs our TP=1 vs HF TP=2 static+compile.

Run by ``benchmarks/tp_session.sh`` under torchrun (one process a GPU, NCCL, multicast off). Per model
(Llama-3.1-8B, Qwen2.5-7B; random weights N(0, 0.02) drawn on the GPU), batch 1 and 8, bf16, prompt
128, greedy:

  phase A  rank 0: our TP=1 on one GPU (patch + CUDA graphs), ms/step and tokens;
           rank 1 meanwhile searches the TP=2 shard kernels on a shard-shaped one-layer model
           (``mirage_serve.tp.shards.simulated``) into the shared cache, so phase C patches warm;
  phase B  NCCL all-reduce: µs per call at decode sizes (eager and inside a CUDA graph), bus
           bandwidth at large sizes, copy bandwidth of each GPU, a graph-capture probe;
  phase C  both ranks: the full model, broadcast from rank 0, sharded by HF's tp_plan
           (``hf_shard.shard_in_place``): ours TP=2 (patch on the shards), then HF TP=2
           static cache + auto torch.compile; tokens against TP=1 with a near-tie check.

Every phase is guarded (an error is recorded, the run goes on) and time-boxed against --deadline:
ranks agree on skipping (an all-reduce of a flag), so collectives always match. Rank 0 writes
``$OUT/tp_session.json`` (and one ``tp_<model>.json`` per model, as soon as it is done) and a
markdown table ``$OUT/tp_session.md``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

from tp_report import capture_errors, table  # benchmarks/tp_report.py (this script's folder is on sys.path)

T0 = time.time()


def log(msg: str) -> None:
    rank = os.environ.get("RANK", "?")
    print(f"[tp rank {rank} {time.time() - T0:6.1f}s] {msg}", flush=True)


def guarded(name: str, fn, *a, **kw) -> dict:
    t = time.time()
    try:
        out = fn(*a, **kw)
        out = out if isinstance(out, dict) else {"value": out}
        out["seconds"] = round(time.time() - t, 2)
        return out
    except Exception as e:  # recorded; the other phases still run
        log(f"{name} FAILED: {type(e).__name__}: {e}")
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {e}", "seconds": round(time.time() - t, 2)}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="Llama-3.1-8B,Qwen2.5-7B")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--layers", type=int, default=None, help="fewer decoder layers (a quick check)")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds after start; later phases are skipped")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--no-hf", action="store_true", help="skip the HF TP static+compile baseline")
    p.add_argument("--hf-models", default=None,
                   help="comma list: the models that get the HF TP baseline (default: every model; it compiles "
                        "for ~130 s a model, so one device call fits it for one 7-8B model beside both TP runs)")
    p.add_argument("--hf-only", action="store_true",
                   help="only HF's TP baseline (and the collectives): a baseline a time-boxed earlier run skipped")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: gloo, fp32, torch backend: the plumbing checked without GPUs")
    p.add_argument("--search-seconds", type=float, default=None, help="search budget per patch (default: the search's)")
    a = p.parse_args()
    a.models = [m for m in a.models.split(",") if m]
    a.hf_models = a.models if a.hf_models is None else [m for m in a.hf_models.split(",") if m]
    a.batch = [int(b) for b in a.batch.split(",")]
    return a


class Session:
    def __init__(self, args):
        import torch
        import torch.distributed as dist

        from mirage_serve.tp.hf_shard import init_distributed
        from mirage_serve.tp.safety import assert_multicast_off

        assert_multicast_off()
        self.args, self.torch, self.dist = args, torch, dist
        self.dev = args.device
        self.dtype = "bf16" if self.dev == "cuda" else "fp32"
        self.rank, self.world = init_distributed(self.dev, timeout_s=420)
        self.budget = None
        if args.search_seconds is not None:
            from superopt.search import SearchBudget
            self.budget = SearchBudget(max_seconds=args.search_seconds)
        self.out = Path(args.out)
        self.sync_dir = Path("/tmp") / f"tp_session_{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        self.result = {"environment": self.environment(), "settings": vars(args) | {"world": self.world},
                       "tp1": {}, "warm": {}, "models": {}}

    # ------------------------------------------------------------------ plumbing
    def environment(self) -> dict:
        import platform

        import torch
        import transformers
        import triton

        from mirage_serve import knobs

        return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
                "transformers": transformers.__version__,
                "device_name": torch.cuda.get_device_name() if self.args.device == "cuda" else "cpu",
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": "bash benchmarks/tp_session.sh (torchrun --nproc-per-node 2 benchmarks/tp_session.py "
                           + " ".join(sys.argv[1:]) + ")",
                "decode_attention": knobs.ATTENTION.get(),  # MIRAGE_SERVE_ATTENTION: which kernels patch() runs
                "multicast_off": {k: os.environ.get(k) for k in
                                  ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}}

    def left(self) -> float:
        return self.args.deadline - (time.time() - T0)

    def agree(self, ok: bool) -> bool:
        """True only if every rank says ok (one all-reduce: ranks skip phases together)."""
        t = self.torch.tensor([1 if ok else 0], device=self.dev, dtype=self.torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t.item())

    def wait_all(self, tag: str, limit: float) -> None:
        """A file barrier (no NCCL time-out while one rank works alone for minutes)."""
        (self.sync_dir / f"{tag}.{self.rank}").touch()
        t = time.time()
        while not all((self.sync_dir / f"{tag}.{r}").exists() for r in range(self.world)):
            if time.time() - t > limit:
                raise TimeoutError(f"ranks did not reach {tag} within {limit:.0f} s")
            time.sleep(0.5)

    def claim(self, tag: str) -> bool:
        """True for the one rank that takes ``tag`` (an exclusive file create)."""
        try:
            os.close(os.open(self.sync_dir / tag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def write_model(self, name: str) -> None:
        if self.rank == 0:
            (self.out / f"tp_{name}.json").write_text(json.dumps(
                {"environment": self.result["environment"], "collectives": self.result.get("collectives"),
                 **self.result["models"][name]}, indent=2, default=str) + "\n")
        self.save()

    def save(self) -> None:
        if self.rank != 0:
            return
        (self.out / "tp_session.json").write_text(json.dumps(self.result, indent=2, default=str) + "\n")

    def free(self) -> None:
        gc.collect()
        if self.dev == "cuda":
            self.torch.cuda.empty_cache()

    def load(self, name: str, layers=None):
        from mirage_serve.bench_load import load

        return load(name, dtype=self.dtype, device=self.dev, layers=layers if layers is not None else self.args.layers,
                    seed=0).model

    def prompt(self, b: int, vocab: int):
        from mirage_serve.bench import _prompt

        return _prompt(b, self.args.prompt, vocab, 0, self.dev)

    def measure(self, model, cache: str, every_rank: bool = True) -> dict:
        """{batch: (ms/step, tokens [B, N])}: bench_timing.decode_step_time at each batch. ``every_rank``: every
        rank runs this model (TP=N), so they skip a batch together; False for rank 0's TP=1 runs."""
        from mirage_serve.bench_timing import decode_step_time

        out, took = {}, 0.0
        for b in self.args.batch:
            # a batch that would likely run past the deadline (a compiled baseline compiles again at each batch,
            # ~1-2 min for a 7-8B model) is left out, so the call ends with its JSONs written
            enough = self.left() > 1.3 * took + 30
            if out and not (self.agree(enough) if every_rank else enough):
                log(f"  b{b} {cache}: skipped, {self.left():.0f} s left and the last batch took {took:.0f} s")
                continue
            t = time.time()
            s, toks = decode_step_time(model, self.prompt(b, model.config.vocab_size), self.args.new_tokens,
                                       cache, self.dev, self.args.repeats)
            out[b] = (s * 1e3, toks)
            took = time.time() - t
            log(f"  b{b} {cache}: {s * 1e3:.3f} ms/step")
        return out

    # ------------------------------------------------------------------ phase A
    def tp1(self, name: str) -> dict:
        import mirage_serve
        from mirage_serve.decode import decode_paths

        model = self.load(name)
        t = time.time()
        report = mirage_serve.patch(model, batch_sizes=tuple(self.args.batch), search_budget=self.budget)
        patch_s = time.time() - t
        log(f"{name} TP=1 patched in {patch_s:.1f} s: {str(report).splitlines()[-1]}")
        try:
            m = self.measure(model, "default", every_rank=False)
            paths = decode_paths(model)
        finally:
            mirage_serve.unpatch(model)
        self.tokens[name] = {b: toks for b, (_, toks) in m.items()}
        del model
        self.free()
        return {"ms_per_step": {b: ms for b, (ms, _) in m.items()}, "patch_seconds": patch_s,
                "report_summary": str(report).splitlines()[-1], "decode_paths": paths,
                "counts": {k: getattr(report, k) for k in ("searches", "cache_hits", "programs", "compiles")}}

    def warm_shards(self, name: str) -> dict:
        """Search the TP shard kernels on a one-layer shard-shaped model (this rank's GPU)."""
        import mirage_serve
        from mirage_serve.bench_load import random_init_
        from mirage_serve.tp import shards
        from transformers import AutoModelForCausalLM

        from mirage_serve import registry

        cfg = registry.hf_config(registry.get(name).with_overrides(num_hidden_layers=1).config)
        cfg = shards.shard_shaped_config(cfg, self.world)
        with self.torch.device(self.dev):
            model = AutoModelForCausalLM.from_config(
                cfg, dtype=self.torch.bfloat16 if self.dev == "cuda" else self.torch.float32).eval()
        random_init_(model, 0)
        with shards.simulated(self.world):
            report = mirage_serve.patch(model, batch_sizes=tuple(self.args.batch), cuda_graphs=False,
                                        decode_attention=False, search_budget=self.budget)
        mirage_serve.unpatch(model)
        del model
        self.free()
        log(f"{name} shard kernels warmed: {str(report).splitlines()[-1]}")
        return {"counts": {k: getattr(report, k) for k in ("searches", "cache_hits", "programs", "compiles")},
                "seconds_patch": report.seconds}

    # ------------------------------------------------------------------ phase B
    def collectives(self) -> dict:
        from superopt.runtime.timing import copy_bandwidth
        from mirage_serve.tp.collective import allreduce_times, graph_capture_probe

        if self.dev != "cuda":
            return {"skipped": "no GPU: NCCL and CUDA graphs are not measured on CPU"}
        probe = graph_capture_probe()
        rows = allreduce_times(graphed=probe.get("ok", False))
        bw = copy_bandwidth(device="cuda")
        bws = [None] * self.world
        self.dist.all_gather_object(bws, bw)
        for r in rows:
            log(f"  all-reduce {r['bytes']:>10} B: eager {r['eager_us']:.1f} µs, graph "
                f"{r.get('graph_us', float('nan')):.1f} µs, busbw {r.get('graph_busbw_GBps', r['eager_busbw_GBps']):.1f} GB/s")
        return {"graph_capture_probe": probe, "allreduce": rows, "copy_bandwidth_GBps": [b / 1e9 for b in bws]}

    # ------------------------------------------------------------------ phase C
    def tp2(self, name: str, res: dict):
        """Load, broadcast and shard the model; ours TP=N into ``res`` (saved as it goes); returns the
        sharded model, kept for the HF baseline later."""
        import mirage_serve
        from mirage_serve import registry
        from mirage_serve.bench_timing import first_divergence
        from mirage_serve.decode import decode_paths
        from mirage_serve.tp.hf_shard import shard_in_place

        model = self.load(name)
        with self.torch.no_grad():
            for p in model.parameters():  # rank 0's weights everywhere (the TP=1 run used them)
                self.dist.broadcast(p.data, 0)
        shard_in_place(model, self.dev)
        self.free()
        ref = self.shared_tokens(name)
        facts = registry.get(name).config if self.args.layers is None else \
            registry.get(name).with_overrides(num_hidden_layers=self.args.layers).config
        res["bytes_per_gpu"] = registry.decode_bytes(facts, self.dtype) / self.world
        graphs = self.result["collectives"].get("graph_capture_probe", {}).get("ok", False)
        if not graphs and self.dev == "cuda":
            res["note"] = "graph capture of an all-reduce failed in phase B: ours runs without CUDA graphs"
        # ours TP=2
        if self.args.hf_only:
            res["ours"] = {"skipped": "--hf-only"}
        elif self.agree(self.left() > 60):
            t = time.time()
            report = None
            try:
                report = mirage_serve.patch(model, batch_sizes=tuple(self.args.batch), search_budget=self.budget,
                                            **({} if graphs else {"cuda_graphs": False}))
                patch_s = time.time() - t
                log(f"{name} TP={self.world} patched in {patch_s:.1f} s: {str(report).splitlines()[-1]}")
                ok = True
            except Exception as e:
                ok, res["ours_error"] = False, f"{type(e).__name__}: {e}"
                traceback.print_exc()
            if self.agree(ok):
                try:
                    m = self.measure(model, "default" if graphs else "static-eager")
                    res["ours"] = {"ms_per_step": {b: ms for b, (ms, _) in m.items()}, "patch_seconds": patch_s,
                                   "report_summary": str(report).splitlines()[-1], "note": report.note,
                                   "decode_paths": decode_paths(model), "capture_errors": capture_errors(model),
                                   "counts": {k: getattr(report, k) for k in
                                              ("searches", "cache_hits", "programs", "compiles")},
                                   "tokens_vs_tp1": self.compare(model, m, ref, first_divergence)}
                finally:
                    mirage_serve.unpatch(model)
            elif report is not None:
                mirage_serve.unpatch(model)
        else:
            res["ours"] = {"skipped": f"deadline ({self.left():.0f} s left)"}
        self.free()
        return model, ref

    def hf(self, model, ref: dict) -> dict:
        """HF TP=N: static cache + auto torch.compile (compiles once per batch size and length)."""
        from mirage_serve.bench_timing import first_divergence

        m = self.measure(model, "static")
        return {"ms_per_step": {b: ms for b, (ms, _) in m.items()},
                "tokens_vs_tp1": self.compare(model, m, ref, first_divergence)}

    def shared_tokens(self, name: str) -> dict:
        """Rank 0's TP=1 tokens, on every rank (the near-tie check runs the model: all ranks must)."""
        obj = [self.tokens.get(name) if self.rank == 0 else None]
        self.dist.broadcast_object_list(obj, 0)
        return obj[0] or {}

    def compare(self, model, measured: dict, ref: dict, first_divergence) -> dict:
        from mirage_serve.bench import TIE_ULPS

        out = {}
        for b, (_, toks) in measured.items():
            want = ref.get(b)
            if want is None:
                out[b] = {"checked": False}
                continue
            want = want.to(toks.device)
            d = first_divergence(want, toks)
            row = {"checked": True, "identical": d is None, "first_divergence": d}
            if d is not None:  # near tie? the sharded model's logits on TP=1's prefix (every rank runs it)
                prompt = self.prompt(b, model.config.vocab_size)[d["row"]:d["row"] + 1]
                seq = self.torch.cat([prompt, want[d["row"]:d["row"] + 1, :d["step"]]], dim=1)
                with self.torch.inference_mode():
                    logits = model(seq).logits[0, -1].float()
                gap = float(logits[d["expected"]] - logits[d["got"]])
                dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
                tol = TIE_ULPS * self.torch.finfo(dtype).eps * float(logits.abs().max())
                row.update(logit_gap=gap, tie_tolerance=tol, near_tie=abs(gap) <= tol)
            out[b] = row
        return out

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        a = self.args
        self.tokens: dict = {}
        log(f"start: {self.result['environment']['device_name']}, world {self.world}, models {a.models}")
        if self.rank == 0 and not a.hf_only:
            for name in a.models:
                if self.left() > 200:
                    self.result["tp1"][name] = guarded(f"tp1 {name}", self.tp1, name)
                else:
                    self.result["tp1"][name] = {"skipped": f"deadline ({self.left():.0f} s left)"}
                self.save()
        # shard kernels: a work queue over the ranks (rank 0 joins after its TP=1 runs, from the end)
        for name in ([] if a.hf_only else a.models if self.rank else reversed(a.models)):
            if self.left() > 150 and self.claim(f"warm.{name}"):
                self.result["warm"][name] = guarded(f"warm {name}", self.warm_shards, name)
        self.wait_all("phaseA", limit=max(self.left(), 30))
        warm = [None] * self.world
        self.dist.all_gather_object(warm, self.result["warm"])
        self.result["warm"] = {k: v for w in warm for k, v in (w or {}).items()}
        self.result["collectives"] = guarded("collectives", self.collectives)
        self.save()
        kept = {}  # ours first for every model (the must-show), then HF's compiled baseline as time allows
        for name in a.models:
            res = self.result["models"][name] = {"tp1": self.result["tp1"].get(name)}
            if not self.agree(self.left() > 100):
                res["skipped"] = f"deadline ({self.left():.0f} s left)"
                continue
            log(f"{name}: TP={self.world}")
            t = time.time()
            try:
                kept[name] = self.tp2(name, res)
            except Exception as e:
                res["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            res["seconds"] = round(time.time() - t, 2)
            self.write_model(name)
        for name, (model, ref) in kept.items():
            res = self.result["models"][name]
            if not self.args.no_hf and name in self.args.hf_models and self.agree(self.left() > 75):
                res["hf_static_compile"] = guarded(f"hf {name}", self.hf, model, ref)
            else:
                res["hf_static_compile"] = {"skipped": f"deadline ({self.left():.0f} s left), --no-hf or not in --hf-models"}
            self.write_model(name)
        kept.clear()
        if self.rank == 0:
            (self.out / "tp_session.md").write_text(table(self.result) + "\n")
            print(table(self.result), flush=True)


def leave(session: Session, rc: int) -> None:
    """Tear down NCCL and exit without Python's own teardown. With HF's compiled TP runs behind it, a rank that had
    written every result hung at exit until the device call's limit (380 s, 2026-11-27), so a watchdog ends it."""
    sys.stdout.flush()
    sys.stderr.flush()
    threading.Timer(20.0, os._exit, args=(rc,)).start()
    try:
        session.dist.destroy_process_group()
    finally:
        os._exit(rc)


if __name__ == "__main__":
    args = parse()
    s = Session(args)
    rc = 1
    try:
        s.run()
        rc = 0
    except BaseException:
        traceback.print_exc()
    finally:
        s.save()
        leave(s, rc)
