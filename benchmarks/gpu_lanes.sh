#!/usr/bin/env bash
# One device call on a multi-GPU machine: several gpu_session.sh runs side by side, one GPU each ("lanes").
#   bash benchmarks/gpu_lanes.sh "VAR=VALUE ... STEP ..." "VAR=VALUE ... STEP ..." ...   ($OUT must be set)
# Each argument is one lane: gpu_session.sh's environment settings, then its steps, quoted as in a shell
# (e.g. "BLOCKS_SUITE=paper BLOCKS_ONLY='GQA b8,QKNorm b8' blocks"). Lane i runs on GPU i only, with its own
# $OUT/lane$i (its output in $OUT/lane$i.out) and kernel cache, so device time buys as many GPU-hours as the
# machine has GPUs. Why this is safe for timings: every timed kernel runs on its own GPU and memory; only the
# host's CPUs are shared (builds and searches run slower, the GPU's timings do not). Keep launch-bound
# end-to-end benches (mirage-serve bench of a small model) in a call of their own: they time the host too.
# Every lane's files come back packed in $OUT/lanes.tar (lane$i/logs.tar, cache_new.tar, ...).
set -u
OUT=${OUT:?set OUT}
gpus=$(nvidia-smi -L | wc -l)
[ $# -le "$gpus" ] || { echo "gpu_lanes: $# lanes asked for, this machine has $gpus GPUs"; exit 2; }
python -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
i=0
for spec in "$@"; do
  mkdir -p "$OUT/lane$i"
  (
    eval "set -- $spec"
    while [ $# -gt 0 ] && [[ $1 == [A-Z_]*=* ]]; do export "$1"; shift; done
    CUDA_VISIBLE_DEVICES=$i OUT=$OUT/lane$i MIRAGE_SERVE_CACHE_DIR=/tmp/ms_cache_lane$i GPU_SESSION_INSTALLED=1 \
      bash benchmarks/gpu_session.sh "$@" >"$OUT/lane$i.out" 2>&1
  ) &
  echo "gpu_lanes: lane $i on GPU $i: $spec"
  i=$((i + 1))
done
wait
for f in "$OUT"/lane*.out; do echo "=== ${f##*/}"; tail -n "${LANE_TAIL:-30}" "$f"; done
(cd "$OUT" && tar -cf lanes.tar lane[0-9]* install.log && rm -rf lane[0-9]* install.log)
ls -la "$OUT"
