"""Parametric-action DQN: python -m workflows.parametric_dqn_workflow --config x.json."""

from reagent_lite.kinds import PARAMETRIC_DQN
from reagent_lite.runner import main

if __name__ == "__main__":
    main(PARAMETRIC_DQN)
