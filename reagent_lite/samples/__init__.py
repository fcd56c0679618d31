"""Generated sample data: gymnasium logging policies and a synthetic parametric-action env.

gymnasium is imported only when a gym env is actually played.
"""

from reagent_lite.samples.generate import SampleData, generate_sample_data
from reagent_lite.samples.gym_logging import LoggedEpisodes, log_gym_episodes
from reagent_lite.samples.parametric_env import Contexts, LoggedBandit, ParametricBanditEnv

__all__ = [
    "Contexts",
    "LoggedBandit",
    "LoggedEpisodes",
    "ParametricBanditEnv",
    "SampleData",
    "generate_sample_data",
    "log_gym_episodes",
]
