"""Workflow entry points: python -m workflows.<name> --config x.json."""
