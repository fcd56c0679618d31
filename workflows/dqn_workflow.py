"""Discrete-action DQN: python -m workflows.dqn_workflow --config x.json [--node_index=n]."""

from reagent_lite.kinds import DQN
from reagent_lite.runner import main

if __name__ == "__main__":
    main(DQN)
