"""d3rlpy beside our workflow on the same logged data: the settings a config implies for
d3rlpy, and the fit-then-score loop over algorithms and seeds (`cartpole_quality.py`,
`acrobot_quality.py`). d3rlpy (2.8.x, the `bench` extra) is imported inside the functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def quiet() -> None:
    """d3rlpy logs every step of its setup to stdout through structlog: warnings only."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def matched_settings(cfg: dict[str, Any], rows: int) -> tuple[dict[str, Any], int]:
    """d3rlpy's config keywords for a workflow config's network (LayerNorm included), batch,
    γ, learning rate, standardised observations and target updates (our soft rate τ as a
    hard copy every 1/τ steps), and the number of updates the workflow makes on `rows`
    transitions."""
    import d3rlpy

    rl, training = cfg.get("rl", {}), cfg["training"]
    hidden = [int(h) for h in training["layers"][1:-1]]
    batch = int(training["minibatch_size"]) * int(training.get("minibatches_per_step", 1))
    # The workflow's steps per epoch (`training.steps_per_epoch`, else one pass) × epochs.
    steps = int(cfg["epochs"]) * int(training.get("steps_per_epoch") or -(-rows // batch))
    common = {
        "batch_size": batch,
        "gamma": float(rl.get("gamma", 0.99)),
        "learning_rate": float(training["learning_rate"]),
        # The same network: d3rlpy's encoder puts LayerNorm after each hidden layer too.
        "encoder_factory": d3rlpy.models.VectorEncoderFactory(
            hidden_units=hidden, use_layer_norm=bool(training.get("layer_norm", False))
        ),
        "observation_scaler": d3rlpy.preprocessing.StandardObservationScaler(),
        "target_update_interval": max(1, round(1.0 / float(rl.get("target_update_rate", 0.01)))),
    }
    print(
        f"d3rlpy {d3rlpy.__version__}: {steps} updates of batch {batch}, hidden {hidden} "
        f"(layer_norm {bool(training.get('layer_norm', False))}), "
        f"gamma {common['gamma']}, lr {common['learning_rate']}, "
        f"target_update_interval {common['target_update_interval']}",
        flush=True,
    )
    return common, steps


def fit_and_score(
    arrays: Arrays,
    action_size: int,
    algos: dict[str, Callable[[], Any]],
    steps: int,
    seeds: list[int],
    score: Callable[[Any], float],
) -> dict[str, list[float]]:
    """For each algorithm and seed: `steps` updates on the logged `arrays` (observations,
    action indices, rewards, terminals), then `score(algo)`; one line per fit."""
    import d3rlpy

    dataset = d3rlpy.dataset.MDPDataset(*arrays, action_size=action_size)
    out: dict[str, list[float]] = {}
    for name, make in algos.items():
        out[name] = []
        for seed in seeds:
            d3rlpy.seed(seed)
            algo = make().create(device="cpu:0")
            start = time.perf_counter()
            algo.fit(
                dataset,
                n_steps=steps,
                n_steps_per_epoch=steps,
                show_progress=False,
                save_interval=steps + 1,
                logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
            )
            mean = score(algo)
            out[name].append(mean)
            print(
                f"  {name} seed {seed}: mean return {mean:.1f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    return out
