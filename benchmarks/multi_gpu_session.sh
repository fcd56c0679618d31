#!/usr/bin/env bash
# Issue 8 on a machine with 2+ GPUs, in one go (logs to $OUT, at most a handful of files):
# the GPU tests of the step runner (one GPU: graph == eager; two GPUs: the graph that
# all-reduces inside itself == the eager DDP step), then benchmarks/multi_gpu.py.
# NVLink multicast stays off, as the machines' notes require.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/multi_gpu_session}
WORK=${WORK:-/tmp/mgpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
STAGES=${STAGES:-"info test bench"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
if has info; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/info.log"
  nvidia-smi topo -m 2>&1 | head -5 | tee -a "$OUT/info.log"
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))" | tee -a "$OUT/info.log"
fi
if has test; then
  echo "=== GPU tests: tests/training/test_steps.py"
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest tests/training/test_steps.py -v -p no:cacheprovider \
    > "$OUT/test.log" 2>&1
  grep -E "PASS|FAIL|ERROR|passed|failed|skipped" "$OUT/test.log" | tail -20
fi
if has bench; then
  echo "=== benchmarks/multi_gpu.py ${BENCH_ARGS:-}"
  rm -rf "$WORK"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-330}" python3 -m benchmarks.multi_gpu --out "$WORK" ${BENCH_ARGS:-} \
    2>&1 | grep -v -E "Gym has been|Please upgrade|Users of this|See the migration" \
    | tee "$OUT/bench.log"
  cp "$WORK/summary.json" "$OUT/" 2>/dev/null
  (cd "$WORK" && tar czf "$OUT/mgpu_logs.tgz" --exclude='data' --exclude='pdata' \
    --exclude='*.pt2' --exclude='*.pt' --exclude='checkpoints' . ) 2>/dev/null
fi
ls -la "$OUT"
