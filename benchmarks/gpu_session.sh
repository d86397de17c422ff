#!/usr/bin/env bash
# One device call: the integrated GPU checks, each step time-boxed, logs under $OUT.
#   bash benchmarks/gpu_session.sh STEP [STEP ...]      (steps below; $OUT must be set)
# Steps: tests | kernel-tests | decode-tests (each one call) | tests-pdl | pytest | attn-choice | registry | warm-patch | trust-patch | cold | overhead | alone-rounds | alone | decode-qwen | decode-llama | decode-qwen3 | {nopdl,unpaired,unfused}-{qwen,llama,qwen3} | profile-qwen | profile-llama | profile-qwen3 | profile-floor | profile-attn | sweep-attn | probe-chain | probe-behind (BEHIND_ARGS: its flags) | probe-gemv | probe-persistent (PERSISTENT: MODEL:BATCH ...; PERSISTENT_ARGS: the probe's flags) |
# blocks | research | unship | warm | bench | diagnose | ab | candidates (CANDIDATES: MODEL:PROGRAM:BATCH ...; run it with
# MIRAGE_SERVE_DETERMINISTIC=0 too to see what ordered sums cost each split-K candidate). Every step's limit is cut to what is left before DEADLINE (default 560 s: a device command may run 600 s,
# and the tars at the end need a few seconds); a step with under 20 s left is skipped.
# (environment: MIRAGE_SERVE_PDL, MIRAGE_SERVE_PAIRED_LAUNCH, MIRAGE_SERVE_FUSED_RESIDUAL, NEW_TOKENS, LLAMA_BATCH, BASELINES; overhead: OVERHEAD (MODEL:BATCH ...); unship: UNSHIP (MODEL:LABELS ..., shipped entries to delete in this copy, so later steps search them); warm: WARM_MODELS, WARM_BATCH; it leaves $OUT/shipped.tar,
# entries in kernels_cache/ form to untar into the repo's kernels_cache/; blocks: BLOCKS_LIMIT (s, default 400), BLOCKS_SUITE (llama, paper, all), BLOCKS_ONLY (substrings of "LABEL DTYPE"), BLOCKS_DTYPES (bfloat16,float16: every suite in each), BLOCKS_WORKERS (build processes, default 12), BLOCKS_PDL (1; 0: candidates built without programmatic dependent launch); attn-choice: ATTN_MODEL, ATTN_BATCH ("1 8"), ATTN_PROMPT; sweep-attn: SWEEP_ARGS (sweep_attention.py flags); profile-floor: PROFILE_MODELS, PROFILE_BATCH ("1 8"), PROFILE_ATTENTION (hand-written), PROFILE_PDL (1; 0: per-kernel times without the overlap), a trace_MODEL_bB.json.gz each for profile_decode_step.py --from-trace; bench: BENCH_MODELS, BENCH_BATCH (default 1,8), BENCH_BASELINES (default static-compile), BENCH_LIMIT (s a model, default 420), a JSON a model and run; pytest: PYTEST_TARGETS, the GPU tests to run, PYTEST_LIMIT (s, default 420: the patch, fast-loop and runner GPU files take about 290 s on a cold machine); ab: AB_MODELS, AB_A (the other tree's directory, e.g. a `git archive` inside the carried folder; default this tree), AB_B_ENV (NAME=VALUE settings of B's runs, e.g. MIRAGE_SERVE_LM_HEAD=1), AB_BATCH (1), AB_ROUNDS (2), AB_TIMEOUT (s a run, default 120; a run that searches and verifies a new program needs more), AB_LIMIT (s, default 500): bench runs of that tree and this one in turn (benchmarks/ab_trees.py)). The kernel cache is $MIRAGE_SERVE_CACHE_DIR
# (default /tmp/ms_cache) while running; the files the call wrote are tarred to $OUT/cache_new.tar at the end,
# so searched μGraphs found on the GPU can be brought back (for kernels_cache/); a cache.tar in the
# working directory is restored first. To run exactly a commit while others edit the tree, archive it
# into an ignored folder and carry that: `git archive HEAD | tar -x -C .clean`, then `cd .clean && ...`
# (the device's copy of .git can be stale, so do not rely on git there). Logs come back packed in $OUT/logs.tar;
# the .log and .json files are moved into it, so a command that tars $OUT/*.log after this script packs nothing
# and, named logs.tar, replaces the logs (session 33 lost two bench JSONs that way).
set -u
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
ulimit -c 0  # a step cut off by its limit dumps its Python stacks (step below), not a core
OUT=${OUT:?set OUT}
export MIRAGE_SERVE_CACHE_DIR=${MIRAGE_SERVE_CACHE_DIR:-/tmp/ms_cache}
[ -f cache.tar ] && tar -C / -xf cache.tar && echo "gpu_session: kernel cache restored from cache.tar"
mkdir -p "$MIRAGE_SERVE_CACHE_DIR"; touch "$OUT/.restored"  # what is newer than this is what the call added
[ "${GPU_SESSION_INSTALLED:-0}" = 1 ] ||  # gpu_lanes.sh installs once for all its lanes
  python -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"

DEADLINE=${DEADLINE:-560}
step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS left=$((DEADLINE - SECONDS))
  [ "$left" -lt 20 ] && { echo "=== $name skipped: ${left}s left before the ${DEADLINE}s deadline"; return 1; }
  [ "$limit" -gt "$left" ] && limit=$left
  local n=2 base=$name
  while [ -e "$OUT/$name.log" ]; do name=$base.$n; n=$((n + 1)); done  # a step run twice keeps both logs
  echo "=== $name (limit ${limit}s)"
  # SIGABRT, not SIGTERM: with PYTHONFAULTHANDLER every Python process of the step (pool workers too: timeout signals
  # its whole process group) writes its threads' stacks into the log, so a hang says where it hung (rc still 124)
  timeout -s ABRT -k 15 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "--- $name rc=$rc in $((SECONDS - t0)) s"; tail -n 40 "$OUT/$name.log"
}

while [ $# -gt 0 ]; do
  case $1 in
    tests) step tests 540 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short --durations=12 \
             tests/patches -k "not registry" ;;  # one call each: together they ran past 420 s (session 43)
    kernel-tests) step kernel_tests 540 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short --durations=12 \
                    tests/mirage_serve/cache tests/superopt/codegen ;;
    registry) step registry 240 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short \
                "tests/patches/test_patch_gpu.py::test_registry_model_decode" ;;
    warm-patch) step warm_llama_1_8 200 mirage-serve warm Llama-3.1-8B --layers 2 --batch 1,8  # fills the user cache
                for i in 1 2; do step "warm_patch_$i" 120 python benchmarks/warm_patch.py Llama-3.1-8B --batch 1,8; done ;;
    trust-patch)  # issue 32: a fresh process over the shipped cache alone (empty user cache, a new secret, empty
                  # Triton cache: every shipped μGraph verified, launches re-profiled where the renderer changed),
                  # then again over the user cache that run signed (0 searches, 0 compiles): with an empty Triton
                  # cache of its own (strict: the signed binaries alone) and with the first run's (a user's rerun)
      d=$(mktemp -d /tmp/ms_trust.XXXX)
      MIRAGE_SERVE_CACHE_DIR=$d/user MIRAGE_SERVE_CACHE_KEY=$d/key/cache-key TRITON_CACHE_DIR=$d/triton1 \
        step trust_patch_shipped 240 python benchmarks/warm_patch.py Llama-3.1-8B --batch 1,8
      MIRAGE_SERVE_CACHE_DIR=$d/user MIRAGE_SERVE_CACHE_KEY=$d/key/cache-key TRITON_CACHE_DIR=$d/triton2 \
        step trust_patch_warm 120 python benchmarks/warm_patch.py Llama-3.1-8B --batch 1,8
      MIRAGE_SERVE_CACHE_DIR=$d/user MIRAGE_SERVE_CACHE_KEY=$d/key/cache-key TRITON_CACHE_DIR=$d/triton1 \
        step trust_patch_rerun 120 python benchmarks/warm_patch.py Llama-3.1-8B --batch 1,8
      MIRAGE_SERVE_CACHE_DIR=$d/user MIRAGE_SERVE_CACHE_KEY=$d/key/cache-key \
        step trust_cache_verify 60 mirage-serve cache verify
      # the first-use verification alone on this host's CPUs, as patch() runs it (TRUST_OLD=1: also as it ran before)
      step trust_verify_cpu 90 python benchmarks/verify_first_use.py Llama-3.1-8B
      [ "${TRUST_OLD:-0}" = 1 ] && step trust_verify_cpu_old 150 python benchmarks/verify_first_use.py Llama-3.1-8B \
        --one-by-one --trials 8 ;;
    cold) step cold_llama_b1 300 python benchmarks/warm_patch.py Llama-3.1-8B --batch 1 --cold ;;  # issue 7: cold cost per site
    overhead) for mb in ${OVERHEAD:-Qwen2.5-0.5B:1 Qwen2.5-0.5B:8 Llama-3.1-8B:1}; do  # host µs per site, kernels alone
                step "overhead_${mb%%:*}_b${mb##*:}" 150 python benchmarks/site_overhead.py "${mb%%:*}" --layers 4 \
                  --batch "${mb##*:}"
              done ;;
    alone-rounds) for mb in Qwen2.5-0.5B:1 Qwen2.5-0.5B:8 Llama-3.1-8B:1 Llama-3.1-8B:8; do  # issue 5, alternating
                    step "rounds_${mb%%:*}_b${mb##*:}" 120 python benchmarks/site_overhead.py "${mb%%:*}" --layers 0 \
                      --no-sites --profile 0 --rounds 3 --batch "${mb##*:}"
                  done ;;
    alone) for m in Qwen2.5-0.5B Llama-3.1-8B; do  # issue 5: kernels alone (no CUDA graphs) vs eager
             step "alone_$m" 200 mirage-serve bench "$m" --no-graphs --batch 1,8 --new-tokens 32 --repeats 2 \
               --baselines eager --markdown "$OUT/alone.md"
           done ;;
    decode-qwen) step decode_qwen 240 python benchmarks/bench_decode.py --models Qwen2.5-0.5B --batch 1,8 \
                    --new-tokens "${NEW_TOKENS:-64}" --repeats 2 --baselines "${BASELINES:-eager}" \
                    --markdown "$OUT/decode.md" --json-dir "$OUT" ;;
    decode-llama) step decode_llama 330 python benchmarks/bench_decode.py --models Llama-3.1-8B \
                    --batch "${LLAMA_BATCH:-1}" --new-tokens "${NEW_TOKENS:-64}" --repeats 2 \
                    --baselines "${BASELINES:-eager}" --markdown "$OUT/decode.md" --json-dir "$OUT" ;;
    decode-qwen3) step decode_qwen3 330 python benchmarks/bench_decode.py --models Qwen3-8B --batch 1,8 \
                    --new-tokens "${NEW_TOKENS:-64}" --repeats 2 --baselines "${BASELINES:-eager}" \
                    --markdown "$OUT/decode.md" --json-dir "$OUT" ;;
    tests-pdl) step tests_pdl 120 python -m pytest -q -m gpu -p no:cacheprovider tests/superopt/codegen/test_triton_gpu.py \
                 -k "pdl or wait" ;;
    nopdl-*|unpaired-*|unfused-*)  # the same decode as a
      # variant, to compare on one machine: nopdl-*: without programmatic dependent launch; unpaired-*: k_proj and
      # v_proj as two launches; unfused-*: the layer's residual adds as torch adds, not in o_proj/down_proj
      case ${1#*-} in qwen) m=Qwen2.5-0.5B b=1,8 ;; qwen3) m=Qwen3-8B b=1,8 ;; llama) m=Llama-3.1-8B b=${LLAMA_BATCH:-1} ;;
                      *) echo "unknown step $1"; shift; continue ;; esac
      case ${1%%-*} in nopdl) variant=MIRAGE_SERVE_PDL=0 ;; unpaired) variant=MIRAGE_SERVE_PAIRED_LAUNCH=0 ;;
                       unfused) variant=MIRAGE_SERVE_FUSED_RESIDUAL=0 ;; esac
      export "$variant"; step "$1" 330 python benchmarks/bench_decode.py --models "$m" --batch "$b" \
        --new-tokens "${NEW_TOKENS:-64}" --repeats 2 --baselines eager --markdown "$OUT/${1%%-*}.md"
      unset "${variant%%=*}" ;;
    profile-qwen) step profile_qwen 120 python benchmarks/profile_decode_step.py Qwen2.5-0.5B ;;
    profile-llama) step profile_llama 200 python benchmarks/profile_decode_step.py Llama-3.1-8B ;;
    profile-qwen3) step profile_qwen3 200 python benchmarks/profile_decode_step.py Qwen3-8B ;;
    profile-floor) for m in ${PROFILE_MODELS:-Qwen2.5-0.5B Qwen3-0.6B Llama-3.2-1B}; do  # issue 29: per kernel, launches a token
                     for b in ${PROFILE_BATCH:-1 8}; do
                       step "profile_${m}_b$b" 150 env MIRAGE_SERVE_PDL="${PROFILE_PDL:-1}" \
                         python benchmarks/profile_decode_step.py "$m" --batch "$b" --attention "${PROFILE_ATTENTION:-hand-written}" \
                         --trace-out "$OUT/trace_${m}_b$b.json"  # re-read later without a GPU: --from-trace
                       gzip -9f "$OUT/trace_${m}_b$b.json" 2>/dev/null
                     done
                   done ;;
    pytest) step pytest "${PYTEST_LIMIT:-420}" python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short ${PYTEST_TARGETS:?set PYTEST_TARGETS} ;;
    decode-tests) step decode_tests 540 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short --durations=12 \
                    tests/mirage_serve/decode ;;
    attn-choice) for b in ${ATTN_BATCH:-1 8}; do  # issue 28, must-show 3: one decode step per attention mode
                   step "attn_choice_b$b" 300 python benchmarks/profile_decode_step.py "${ATTN_MODEL:-Llama-3.1-8B}" \
                     --batch "$b" --prompt-len "${ATTN_PROMPT:-128}" --attention hand-written,searched,profiled
                 done ;;
    profile-attn) step profile_attn 200 env PYTHONPATH="$PWD" python benchmarks/profile_attention.py ;;  # issue 4: per kernel
    sweep-attn) step sweep_attn 450 env PYTHONPATH="$PWD" python benchmarks/sweep_attention.py ${SWEEP_ARGS:-} ;;  # launch plans
    probe-chain) step probe_chain 240 env PYTHONPATH="$PWD" python benchmarks/probe_launch_chain.py ;;  # issue 29's ceiling
    probe-behind) step probe_behind 240 env PYTHONPATH="$PWD" python benchmarks/probe_attention_behind.py ${BEHIND_ARGS:-} ;;  # the attention behind a full GPU
    probe-persistent) for mb in ${PERSISTENT:-Qwen2.5-0.5B:1 Qwen3-0.6B:1 Llama-3.2-1B:1 Qwen2.5-0.5B:8}; do  # issue 29:
                        # a step's site kernels one by one vs one persistent launch (docs/persistent.md)
                        step "persistent_${mb%%:*}_b${mb##*:}" 200 env PYTHONPATH="$PWD" \
                          python benchmarks/probe_persistent_layers.py "${mb%%:*}" --batch "${mb##*:}" ${PERSISTENT_ARGS:-}
                      done ;;
    candidates) for ms in ${CANDIDATES:?set CANDIDATES to MODEL:PROGRAM:BATCH ...}; do  # every candidate a site's search
                  IFS=: read -r m prog b <<<"$ms"                                   # offers, timed (and its launches)
                  step "candidates_${m}_${prog}_b$b" 150 python benchmarks/profile_site_candidates.py "$m" "$prog" \
                    --batch "$b" --tried
                done ;;
    probe-gemv) step probe_gemv_qkv 150 env PYTHONPATH="$PWD" python benchmarks/probe_gemv_ceiling.py --n 6144 --k 4096
                step probe_gemv_o 150 env PYTHONPATH="$PWD" python benchmarks/probe_gemv_ceiling.py --n 4096 --k 4096 ;;
    research) export MIRAGE_SERVE_RESEARCH=1  # every later step's patch() searches the shipped programs
              # again; a shipped entry's μGraph competes with the new candidates (kept unless one is 5% faster)
              # and the winner goes to the user cache, emptied here so entries an earlier step made cannot
              # stand in for the shipped ones
              rm -rf "$MIRAGE_SERVE_CACHE_DIR" ;;
    unship) for ml in ${UNSHIP:?set UNSHIP to MODEL:LABELS ...}; do  # e.g. Qwen3-8B:attn_in: later steps search them
              step "unship_${ml%%:*}" 60 python benchmarks/shipped_coverage.py "${ml%%:*}" --remove "${ml#*:}"
            done ;;
    warm) DEADLINE=$((DEADLINE - 40))  # the export below must still run when the models use up the time
          for m in ${WARM_MODELS:?set WARM_MODELS to registry names}; do  # issue 7: the shipped cache
            step "warm_$m" 300 mirage-serve warm "$m" --layers 2 --batch "${WARM_BATCH:-1,2,4,8,16}"
          done
          DEADLINE=$((DEADLINE + 40))
          step export_shipped 60 python -c "from mirage_serve.cache import KernelCache; \
            print(KernelCache(shipped_dir=False).export_shipped('/tmp/shipped'), 'entries')" \
            && tar -C /tmp -cf "$OUT/shipped.tar" shipped ;;
    blocks) limit=${BLOCKS_LIMIT:-400}  # issue 4's table; rows not started by the deadline say so
            step blocks "$limit" env PYTHONPATH="$PWD" python benchmarks/bench_blocks.py --suite "${BLOCKS_SUITE:-llama}" \
              --dtypes "${BLOCKS_DTYPES:-bfloat16,float16}" --deadline-s $((limit - 45)) --only "${BLOCKS_ONLY:-}" \
              --compile-budget-s $((limit - 45)) --workers "${BLOCKS_WORKERS:-12}" --out "$OUT/blocks.md" \
              $([ "${BLOCKS_PDL:-1}" = 0 ] && echo --no-pdl) ;;  # the baselines compile ahead: time them all
    diagnose) for m in ${DIAG_MODELS:?set DIAG_MODELS to registry names}; do  # a greedy divergence: kernels, loop or noise
                step "diagnose_$m" 200 python benchmarks/diagnose_greedy.py "$m" --batch "${DIAG_BATCH:-8}" \
                  --steps "${DIAG_STEPS:-16}"
              done ;;
    bench) for m in ${BENCH_MODELS:?set BENCH_MODELS to registry names}; do  # the user's command, one JSON a model
             j="$OUT/bench_$m.json"; n=2; while [ -e "$j" ]; do j="$OUT/bench_$m.$n.json"; n=$((n + 1)); done
             step "bench_$m" "${BENCH_LIMIT:-420}" mirage-serve bench "$m" --batch "${BENCH_BATCH:-1,8}" \
               --baselines "${BENCH_BASELINES:-static-compile}" --json "$j"
           done ;;
    ab) step ab "${AB_LIMIT:-500}" python benchmarks/ab_trees.py ${AB_MODELS:?set AB_MODELS to registry names} \
          --a-dir "${AB_A:-.}" ${AB_B_ENV:+--b-env $AB_B_ENV} --batch "${AB_BATCH:-1}" --rounds "${AB_ROUNDS:-2}" \
          --timeout "${AB_TIMEOUT:-120}" ;;
        # B: this tree (with AB_B_ENV's settings); A: the tree AB_A, or this one
    *) echo "unknown step $1" ;;
  esac
  shift
done
# Only the entries this call wrote come back (a whole cache passes the device tool's size limit on what it
# returns): $OUT/cache_new.tar, to untar over the cache.tar that was restored.
(cd / && find "${MIRAGE_SERVE_CACHE_DIR#/}" -newer "$OUT/.restored" -type f -print | tar -cf "$OUT/cache_new.tar" -T -)
rm -f "$OUT/.restored"
# The device tool brings back at most 8 files from $OUT: everything but the tars goes into logs.tar
# (logs.2.tar, ... when an earlier run of this script in the same command left one).
logs=logs.tar; n=2
while [ -e "$OUT/$logs" ]; do logs=logs.$n.tar; n=$((n + 1)); done
(cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.tar' -printf '%f\n' | tar -cf "$logs" -T - \
  && find . -maxdepth 1 -type f ! -name '*.tar' -delete)
ls -la "$OUT"
