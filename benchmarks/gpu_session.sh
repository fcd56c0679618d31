#!/usr/bin/env bash
# Everything the GPU figures of issue 7 need, in one go on a CUDA machine (logs to $OUT):
# the graph-vs-eager GPU test, bench_train at batch 1024 / 8192 (ours vs bare, eager and
# graph, resident and streamed), the real workflow entry point, parametric, and the sample
# config with use_all_avail_gpus. Wheels in .whl/ (pydantic, gymnasium) are installed first
# when present. Each stage has its own time limit so one slow stage cannot eat the rest.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
STAGES=${STAGES:-"info test b1024 b8192 workflow sample param scale cpu"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
quiet() { grep -v -E "^\[reagent-lite|^[0-9-]{10} [0-9:]{8} (INFO|WARNING) reagent_lite|Gym has been|Please upgrade|Users of this|See the migration"; }
if has info; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, pyarrow, pandas, pydantic, gymnasium, tqdm; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(0), 'pyarrow', pyarrow.__version__, 'pydantic', pydantic.__version__, 'gymnasium', gymnasium.__version__)"
fi
if has test; then
  echo "=== GPU test: graph step == eager step"
  timeout 240 python3 -m pytest tests/training/test_steps.py -v -p no:cacheprovider > "$OUT/test.log" 2>&1
  grep -E "PASS|FAIL|ERROR|Error|error|passed|failed|File .*reagent_lite|File .*tests/" "$OUT/test.log" | head -40
fi
if has b1024; then
  echo "=== bench_train cuda batch 1024"
  timeout 200 python3 -m benchmarks.bench_train --device cuda --batch 1024 --no-d3rlpy \
    --steps 1000 --rounds 3 --modes resident,streamed 2>&1 | quiet | tee "$OUT/bench_1024.log"
fi
if has b8192; then
  echo "=== bench_train cuda batch 8192"
  timeout 150 python3 -m benchmarks.bench_train --device cuda --batch 8192 --no-d3rlpy --no-cpe \
    --steps 500 --rounds 3 --modes resident,streamed 2>&1 | quiet | tee "$OUT/bench_8192.log"
fi
if has workflow; then
  echo "=== workflows.dqn_workflow entry point"
  timeout 240 python3 -m benchmarks.bench_workflow --batches 1024,8192 --graphs on,off --epochs 4 \
    --transitions-per-epoch 4e6 --json "$OUT/workflow.json" 2>&1 | quiet | tee "$OUT/workflow.log"
fi
if has sample; then
  echo "=== sample config, use_all_avail_gpus (NCCL plan)"
  mkdir -p /tmp/sample && sed -e 's#outputs/cartpole_dqn#/tmp/sample/cartpole_dqn#g' \
    sample_configs/discrete_action/cartpole_dqn.json > /tmp/sample/cartpole_dqn.json
  { python3 -m workflows.dqn_workflow --config /tmp/sample/cartpole_dqn.json --dry_run 2>&1 | tail -30
    timeout 200 python3 -m workflows.dqn_workflow --config /tmp/sample/cartpole_dqn.json 2>&1 | tail -40
    echo "exit $?"; ls -la /tmp/sample/cartpole_dqn/model
    tail -2 /tmp/sample/cartpole_dqn/model/metrics.jsonl; } > "$OUT/sample_run.log" 2>&1
  tail -60 "$OUT/sample_run.log"
fi
if has param; then
  echo "=== parametric, 16 candidates"
  timeout 200 python3 -m benchmarks.bench_train --device cuda --batch 1024 --no-d3rlpy --no-cpe \
    --kind dqn,parametric --steps 1000 --rounds 3 2>&1 | quiet | tee "$OUT/bench_param.log"
fi
if has scale; then
  # Cost curve as the table grows, resident vs streamed from host (several chunks per epoch).
  for rows in 100000 1000000 10000000; do
    echo "=== bench_train cuda batch 8192, $rows rows"
    timeout 150 python3 -m benchmarks.bench_train --device cuda --batch 8192 --no-d3rlpy --no-cpe \
      --rows $rows --steps 400 --rounds 2 --modes resident,streamed 2>&1 | quiet \
      | tee -a "$OUT/bench_scale.log"
  done
fi
if has cpu; then
  # A 2-core CPU box like the issue's, carved out of this one: two cores, two threads.
  echo "=== bench_train cpu batch 1024 on 2 cores"
  OMP_NUM_THREADS=2 timeout 240 taskset -c 2,3 python3 -m benchmarks.bench_train --device cpu \
    --batch 1024 --steps 150 --rounds 5 2>&1 | quiet | grep -av $'\e' | tee "$OUT/bench_cpu.log"
  OMP_NUM_THREADS=2 timeout 200 taskset -c 2,3 python3 -m benchmarks.bench_train --device cpu \
    --batch 1024 --steps 40 --rounds 3 --no-cpe --no-d3rlpy --kind dqn,parametric 2>&1 | quiet \
    | tee "$OUT/bench_cpu_param.log"
fi
