#!/usr/bin/env bash
# CI: the built wheel works outside the repository. Builds the wheel, installs it into a
# fresh venv and, from a directory outside the checkout (PYTHONPATH cleared), checks:
#   the console script's --help; `reagent-lite schema --check` and
#   `python -m reagent_lite.config.schema --check` against the packaged schemas; a tiny
#   training through `reagent-lite dqn` with key=value overrides (one of the packaged
#   sample configs); `reagent-lite predict` to CSV; the Python API (train -> RunResult,
#   a typed error and never SystemExit, load_model); that nothing was written into the
#   installed package.
# The wheel is installed with --no-deps and the fresh venv sees the dependencies of the
# dev venv through a .pth line (no network, no second torch download); with
# WHEEL_SMOKE_DEPS=index the dependencies are installed from the package index instead.
# Usage: bash scripts/wheel_smoke.sh   (PYTHON=... for the build interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# Absolute, symlinks kept (a venv's python is a link to the base interpreter).
PY=$(realpath -s "${PYTHON:-.venv/bin/python}")
LIMIT_S=${WHEEL_SMOKE_TIMEOUT_S:-300}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/reagent-lite-wheel.XXXXXX")
finish() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "wheel_smoke: FAILED (work dir kept: $WORK)" >&2
  else
    rm -rf "$WORK"
  fi
}
trap finish EXIT
unset PYTHONPATH
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

echo "wheel_smoke: building the wheel"
# Built from a copy of the tracked files so the checkout gets no build/ or egg-info.
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$WORK/src/"
(cd "$WORK/src" && "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" .)
WHEEL=$(ls "$WORK"/dist/reagent_lite-*.whl)

echo "wheel_smoke: installing $(basename "$WHEEL") into a fresh venv"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
if [ "${WHEEL_SMOKE_DEPS:-dev-venv}" = index ]; then
  "$VPY" -m pip install -q "$WHEEL"
else
  site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/_dev_deps.pth"
  "$VPY" -m pip install -q --no-deps "$WHEEL"
fi
mkdir "$WORK/outside" && cd "$WORK/outside"
PKG=$("$VPY" -c 'import importlib.util as u; print(u.find_spec("reagent_lite").submodule_search_locations[0])')
case "$PKG" in
  "$WORK"/venv/*) ;;
  *) echo "wheel_smoke: reagent_lite imported from $PKG, not the fresh venv" >&2; exit 1 ;;
esac
listing() { (cd "$PKG" && find . -path '*/__pycache__' -prune -o -type f -print | sort | xargs sha1sum); }
listing >"$WORK/pkg.before"

RL="$WORK/venv/bin/reagent-lite"
run() { timeout -k 10 "$LIMIT_S" "$@"; }

echo "wheel_smoke: console script and packaged schema check"
run "$RL" --help >/dev/null
run "$RL" dqn --help >/dev/null
run "$RL" schema --check
run "$VPY" -m reagent_lite.config.schema --check
rc=0; run "$RL" schema >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { echo "wheel_smoke: 'schema' without --out-dir exited $rc, expected 2" >&2; exit 1; }

echo "wheel_smoke: tiny training through the console script, with overrides"
CFG=$("$VPY" -c 'import reagent_lite; print(reagent_lite.sample_config("ci/dqn_1node.json"))')
run "$RL" dqn --config "$CFG" epochs=1 training.steps_per_epoch=5 \
  evaluation.online_episodes=0 model_output_path=out/cli >"$WORK/cli.log" 2>&1 \
  || { tail -n 40 "$WORK/cli.log"; exit 1; }
test -f out/cli/model.pt2
grep -q '"epochs": 1' out/cli/config.json

echo "wheel_smoke: predict to CSV"
run "$RL" predict --model out/cli --data outputs/ci/dqn_1node/data/eval.parquet \
  --output scores.csv
head -n 1 scores.csv | grep -q q_values

echo "wheel_smoke: the Python API"
run "$VPY" - <<'PY'
import reagent_lite

cfg = str(reagent_lite.sample_config("ci/dqn_1node.json"))
overrides = {
    "epochs": 1,
    "training.steps_per_epoch": 5,
    "evaluation.online_episodes": 0,
    "model_output_path": "out/api",
}
result = reagent_lite.train(cfg, overrides=overrides)
assert result.model_path.is_file() and result.selected_epoch == 0, result
assert result.epoch_metrics and "cpe" in result.final_metrics, result.final_metrics
try:
    reagent_lite.train(cfg, overrides={"epochs": 0})
except reagent_lite.ConfigError as err:
    assert "epochs" in str(err), err
else:
    raise AssertionError("epochs=0 was accepted")
model = reagent_lite.load_model(result.model_dir)
print("api ok:", model.actions, sorted(result.final_metrics["cpe"])[:2])
PY

listing >"$WORK/pkg.after"
if ! diff -q "$WORK/pkg.before" "$WORK/pkg.after" >/dev/null; then
  echo "wheel_smoke: files in the installed package changed:" >&2
  diff "$WORK/pkg.before" "$WORK/pkg.after" >&2 || true
  exit 1
fi
echo "wheel_smoke: OK"
