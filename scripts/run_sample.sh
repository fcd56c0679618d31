#!/usr/bin/env bash
# Sets up .venv if needed, then trains the shipped CartPole DQN sample config end to end:
# it generates its own logged data, trains, evaluates (CPE + online), exports the model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
config=${1:-sample_configs/discrete_action/cartpole_dqn.json}
exec .venv/bin/python -m workflows.dqn_workflow --config "$config"
