#!/usr/bin/env bash
# CI smoke: the tiny configs of sample_configs/ci/ end to end on CPU, each with a hard timeout:
#   1. dqn, one node;  2. parametric_dqn, one node;
#   3. dqn over 2 nodes: two background processes (--node_index=0 and 1) whose shared
#      filesystem is a temp directory; exactly one model.pt2 must come out.
# Paths of the configs are rewritten into that temp directory (removed on exit; kept, with
# the logs printed, on failure). Usage: bash scripts/ci_smoke.sh   (PYTHON=... to override)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LIMIT_S=${CI_SMOKE_TIMEOUT_S:-600}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/reagent-lite-ci-smoke.XXXXXX")
PIDS=()
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

finish() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    for log in "$WORK"/*.log; do
      [ -f "$log" ] && { echo "----- $log (last 60 lines)"; tail -n 60 "$log"; }
    done
    echo "ci_smoke: FAILED (work dir kept: $WORK)" >&2
  else
    rm -rf "$WORK"
  fi
}
trap finish EXIT

# Copies sample_configs/ci/$1.json to $WORK/$1.json with every path inside $WORK/$1.
rewrite() {
  "$PY" - "$1" "$WORK" <<'EOF'
import json, sys
from pathlib import Path
name, work = sys.argv[1], Path(sys.argv[2])
cfg = json.loads(Path(f"sample_configs/ci/{name}.json").read_text())
cfg.pop("$schema", None)
root = work / name
for key in ("training_data_path", "eval_data_path", "model_output_path"):
    if cfg.get(key):
        cfg[key] = str(root / Path(cfg[key]).relative_to(f"outputs/ci/{name}"))
if cfg.get("init_method"):
    cfg["init_method"] = (root / "rendezvous").as_uri()
(work / f"{name}.json").write_text(json.dumps(cfg, indent=1))
EOF
}

check_model() {  # $1 = run name: exactly one model.pt2 and its metadata
  local n
  n=$(find "$WORK/$1" -name model.pt2 | wc -l)
  [ "$n" -eq 1 ] || { echo "ci_smoke: $1 produced $n model.pt2 files, expected 1" >&2; exit 1; }
  [ -f "$WORK/$1/model/model_meta.json" ] || { echo "ci_smoke: $1 has no model_meta.json" >&2; exit 1; }
}

for spec in dqn:dqn_1node parametric_dqn:parametric_1node; do
  kind=${spec%%:*}; name=${spec#*:}
  rewrite "$name"
  echo "ci_smoke: $name"
  timeout -k 10 "$LIMIT_S" "$PY" -m "workflows.${kind}_workflow" --config "$WORK/$name.json" \
    >"$WORK/$name.log" 2>&1
  check_model "$name"
done

name=dqn_2nodes
rewrite "$name"
echo "ci_smoke: $name (node_index 0 and 1 in the background)"
for k in 0 1; do
  timeout -k 10 "$LIMIT_S" "$PY" -m workflows.dqn_workflow --config "$WORK/$name.json" \
    --node_index="$k" >"$WORK/$name.node$k.log" 2>&1 &
  PIDS+=($!)
done
for k in 0 1; do
  if ! wait "${PIDS[$k]}"; then
    echo "ci_smoke: $name node $k failed" >&2
    exit 1
  fi
done
PIDS=()
check_model "$name"
grep -q "world_size\": 2" "$WORK/$name/model/model_meta.json" \
  || { echo "ci_smoke: $name did not train with world size 2" >&2; exit 1; }
if [ -n "$(find "$WORK/$name" -name 'store-*')" ]; then
  echo "ci_smoke: $name left rendezvous store files behind" >&2
  exit 1
fi
echo "ci_smoke: OK"
