#!/usr/bin/env bash
# Sets up .venv if needed, then trains a shipped sample config end to end (default: the
# CartPole DQN one): it generates its own logged data, trains, evaluates (CPE + online),
# exports the model and draws report.png. Usage: bash scripts/run_sample.sh [config.json]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
config=${1:-sample_configs/discrete_action/cartpole_dqn.json}
# `train` runs the workflow the config's "workflow" key names; --overwrite: rerunning the
# sample replaces the sample model (a finished model is kept otherwise).
exec .venv/bin/python -m reagent_lite.console train --config "$config" --overwrite
