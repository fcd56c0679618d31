"""reagent-lite: declarative offline reinforcement learning from logged data."""

__version__ = "0.1.0"
