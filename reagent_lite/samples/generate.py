"""Generate a sample data set on disk: step logs, training table, eval table (+ values).

`generate_sample_data` is what a workflow calls when its config has a `sample_data` block
and the training data does not exist yet; `python -m workflows.make_sample_data` is the
same from the command line. Everything is seeded, so the same arguments give the same files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reagent_lite.data.timeline import build_training_table, write_table
from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import atomic_write_json
from reagent_lite.samples.gym_logging import POLICIES, log_gym_episodes
from reagent_lite.samples.parametric_env import ParametricBanditEnv

KINDS = ("gym", "synthetic_parametric")
VALUES_FILE = "values.json"


@dataclass(frozen=True)
class SampleData:
    """Where the generated files are and a few figures about them."""

    steps_path: Path
    training_data_path: Path
    eval_data_path: Path
    values_path: Path | None  # JSON with the true values (synthetic_parametric only)
    steps: int
    train_rows: int
    eval_rows: int
    summary: dict[str, Any]


DEFAULTS: dict[str, Any] = {
    "kind": "gym",
    "env": "CartPole-v1",
    "episodes": 1000,
    "policy": "random",
    "epsilon": 0.1,
    "random_episode_fraction": 0.0,
    "seed": 0,
    "eval_fraction": 0.1,
    "parametric": False,
    "states": None,
    "episode_length": 1,
    "min_candidates": 4,
    "max_candidates": 16,
    "output_dir": None,
    "training_data_path": None,
    "eval_data_path": None,
    "steps_path": None,
}


def generate_sample_data(
    params: Mapping[str, Any] | object | None = None,
    /,
    *,
    kind: str | None = None,
    env: str | None = None,
    episodes: int | None = None,
    policy: str | None = None,
    epsilon: float | None = None,
    random_episode_fraction: float | None = None,
    seed: int | None = None,
    eval_fraction: float | None = None,
    parametric: bool | None = None,
    states: int | None = None,
    episode_length: int | None = None,
    min_candidates: int | None = None,
    max_candidates: int | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    training_data_path: str | os.PathLike[str] | None = None,
    eval_data_path: str | os.PathLike[str] | None = None,
    steps_path: str | os.PathLike[str] | None = None,
) -> SampleData:
    """Generate step logs and turn them into train / eval tables (docs/DATA_FORMAT.md).

    Each field is taken from its keyword argument if given (not None), else from `params`
    (a mapping, or any object with these attributes such as a config's `sample_data`
    block), else from `DEFAULTS`. Paths: `training_data_path`, `eval_data_path` and
    `steps_path` default to `train.parquet`, `eval.parquet`, `steps.parquet` in
    `output_dir` (or in the directory of `training_data_path` when only that is given).

    kind="gym": `episodes` episodes of `env` under `policy` ("random" or "epsilon_greedy"),
    a `random_episode_fraction` of them played uniformly at random instead;
    `parametric=True` logs actions as one-hot feature maps for the parametric workflow.
    kind="synthetic_parametric": `states` (default `episodes`) episodes of
    `episode_length` steps of `ParametricBanditEnv` (seeded by `seed`); also writes
    `values.json` with the exact optimal, logging and random policy values.
    """
    given = dict(
        kind=kind,
        env=env,
        episodes=episodes,
        policy=policy,
        epsilon=epsilon,
        random_episode_fraction=random_episode_fraction,
        seed=seed,
        eval_fraction=eval_fraction,
        parametric=parametric,
        states=states,
        episode_length=episode_length,
        min_candidates=min_candidates,
        max_candidates=max_candidates,
        output_dir=output_dir,
        training_data_path=training_data_path,
        eval_data_path=eval_data_path,
        steps_path=steps_path,
    )
    fields = dict(DEFAULTS)
    for name, value in given.items():
        if value is None and params is not None:
            getter = params.get if isinstance(params, Mapping) else vars_of(params).get
            value = getter(name)
        if value is not None:
            fields[name] = value
    return _generate(**fields)


def vars_of(obj: object) -> dict[str, Any]:
    """Attributes of a config object (Pydantic model, dataclass, namespace) as a dict."""
    dump = getattr(obj, "model_dump", None)
    return dict(dump()) if callable(dump) else dict(vars(obj))


def _resolve_paths(
    output_dir: Any, training_data_path: Any, eval_data_path: Any, steps_path: Any
) -> tuple[Path, Path, Path, Path]:
    if output_dir is None and training_data_path is None:
        raise ConfigError("sample_data: give output_dir or training_data_path")
    base = Path(output_dir) if output_dir is not None else Path(training_data_path).parent
    train = Path(training_data_path) if training_data_path else base / "train.parquet"
    evaluation = Path(eval_data_path) if eval_data_path else base / "eval.parquet"
    steps = Path(steps_path) if steps_path else base / "steps.parquet"
    return base, train, evaluation, steps


def _generate(
    *,
    kind: str,
    env: str,
    episodes: int,
    policy: str,
    epsilon: float,
    random_episode_fraction: float,
    seed: int,
    eval_fraction: float,
    parametric: bool,
    states: int | None,
    episode_length: int,
    min_candidates: int,
    max_candidates: int,
    output_dir: Any,
    training_data_path: Any,
    eval_data_path: Any,
    steps_path: Any,
) -> SampleData:
    if kind not in KINDS:
        raise ConfigError(f"sample_data.kind: expected one of {', '.join(KINDS)} (got {kind!r})")
    if policy not in POLICIES:
        raise ConfigError(
            f"sample_data.policy: expected one of {', '.join(POLICIES)} (got {policy!r})"
        )
    base, train_path, eval_path, steps_file = _resolve_paths(
        output_dir, training_data_path, eval_data_path, steps_path
    )
    values_path: Path | None = None
    if kind == "gym":
        try:
            logged = log_gym_episodes(
                env,
                int(episodes),
                policy=policy,  # type: ignore[arg-type]
                epsilon=float(epsilon),
                seed=int(seed),
                actions_as_features=bool(parametric),
                random_episode_fraction=float(random_episode_fraction),
            )
        except ValueError as err:
            raise ConfigError(f"sample_data: {err}") from err
        steps = logged.steps
        summary: dict[str, Any] = {
            "kind": kind,
            "env": env,
            "policy": policy,
            "epsilon": epsilon if policy == "epsilon_greedy" else None,
            "random_episode_fraction": float(random_episode_fraction),
            "episodes": int(episodes),
            "mean_return": logged.mean_return,
            "mean_length": float(logged.lengths.mean()) if len(logged.lengths) else 0.0,
            "truncated_fraction": float(logged.truncated.mean()) if episodes else 0.0,
        }
    else:
        try:
            bandit = ParametricBanditEnv(
                min_candidates=int(min_candidates),
                max_candidates=int(max_candidates),
                episode_length=int(episode_length),
                seed=int(seed),
            )
        except ValueError as err:
            raise ConfigError(f"sample_data: {err}") from err
        n_episodes = int(states if states is not None else episodes)
        logged_bandit = bandit.log_episodes(n_episodes, seed=int(seed))
        steps = logged_bandit.steps
        summary = {
            "kind": kind,
            "episodes": n_episodes,
            "env": bandit.to_dict(),
            # Per-step expected rewards: on the logged states, and on held-out fresh states.
            "logged_states": {
                "optimal_value": bandit.optimal_value(logged_bandit.contexts),
                "logging_value": bandit.logging_value(logged_bandit.contexts),
                "random_value": bandit.random_value(logged_bandit.contexts),
            },
            "optimal_value": bandit.optimal_value(),
            "logging_value": bandit.logging_value(),
            "random_value": bandit.random_value(),
        }
        values_path = base / VALUES_FILE

    train, evaluation = build_training_table(
        steps, eval_fraction=float(eval_fraction), seed=int(seed), source=str(steps_file)
    )
    if float(eval_fraction) > 0 and evaluation.num_rows == 0:
        raise ConfigError(
            f"sample_data.eval_fraction: {eval_fraction} of {summary['episodes']} episodes drew "
            "no eval episode (episodes are split by a hash of their id); give more episodes, "
            "or eval_fraction 0"
        )
    write_table(steps, steps_file)
    write_table(train, train_path)
    write_table(evaluation, eval_path)
    summary.update(steps=steps.num_rows, train_rows=train.num_rows, eval_rows=evaluation.num_rows)
    if values_path is not None:
        atomic_write_json(values_path, summary)
    return SampleData(
        steps_path=steps_file,
        training_data_path=train_path,
        eval_data_path=eval_path,
        values_path=values_path,
        steps=steps.num_rows,
        train_rows=train.num_rows,
        eval_rows=evaluation.num_rows,
        summary=summary,
    )
