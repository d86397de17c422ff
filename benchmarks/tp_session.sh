#!/usr/bin/env bash
# Issue 30, must-show 2: one device call on nvidia-h100-x2 (two GPUs of one host), at most 10 minutes.
#   OUT=/some/dir bash benchmarks/tp_session.sh [tp_session.py arguments, e.g. --models Llama-3.1-8B]
# Runs benchmarks/tp_session.py on 2 ranks under torchrun (NCCL): Llama-3.1-8B and Qwen2.5-7B at TP=2,
# batch 1 and 8: ours TP=2 vs our TP=1 vs HF TP=2 static+compile, tokens vs TP=1, NCCL all-reduce
# timing. Writes $OUT/tp_session.{json,md,log}, $OUT/tp_<model>.json, and $OUT/cache.tar (the kernel
# cache, with the TP=2 shard kernels it searched, for kernels_cache/).
# SEARCH_SECONDS (default 45): the search budget per program for the TP=2 shard kernels (cold on first run).
# NVLink multicast stays off in every process started here (NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1); the workers assert it.
set -u
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
export MIRAGE_SERVE_CACHE_DIR=${MIRAGE_SERVE_CACHE_DIR:-/tmp/ms_cache_tp}
[ -f cache.tar ] && tar -C / -xf cache.tar && echo "tp_session: kernel cache restored from cache.tar"
python -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
BUDGET=${BUDGET:-585}                     # seconds this script may take in all (a device call: 600)
left=$((BUDGET - SECONDS))
deadline=$((left - 45))                   # the python phases plan against this (start-up and tar after)
echo "tp_session: ${left}s left, python deadline ${deadline}s"
timeout --kill-after=10 $((left - 15)) python -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-2}" \
  benchmarks/tp_session.py --out "$OUT" --deadline "$deadline" --search-seconds "${SEARCH_SECONDS:-45}" "$@" >"$OUT/tp_session.log" 2>&1
rc=$?
echo "tp_session: torchrun rc=$rc after ${SECONDS}s"
grep -v -i "warn" "$OUT/tp_session.log" | tail -n 60
[ -d "$MIRAGE_SERVE_CACHE_DIR" ] && tar -C / -cf "$OUT/cache.tar" "${MIRAGE_SERVE_CACHE_DIR#/}" 2>/dev/null
exit $rc
