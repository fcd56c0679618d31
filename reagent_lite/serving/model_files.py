"""The model a policy serves, loaded from a run's `model_output_path` as `predict` loads it
(model_meta.json's digest checked against model.pt2, the program's signature against the
meta), plus what acting needs: feature and action positions, and the model's id."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reagent_lite.errors import ConfigError
from reagent_lite.kinds import DiscreteSpace, ParametricSpace

SERVED_KINDS = ("dqn", "parametric_dqn")
# The two files a model is: a new model has landed when either changes.
MODEL_FILES = ("model.pt2", "model_meta.json")
FilesKey = tuple[tuple[int, int, int] | None, ...]


@dataclass(frozen=True)
class LoadedModel:
    model_id: str  # model.pt2's SHA-256, as model_meta.json names (and loading checked) it
    kind: str
    program: Callable[..., torch.Tensor]
    state_ids: list[str]
    actions: list[str]  # dqn
    action_ids: list[str]  # parametric_dqn: the action features
    loaded_at: float  # time.time()
    files: FilesKey  # the files' identity when loaded
    state_index: dict[str, int]  # state feature id → column
    action_index: dict[str, int]  # dqn: action name → Q column; parametric: feature → column

    def row(self, features: Mapping[str, float], index: Mapping[str, int]) -> np.ndarray:
        """`features` as one row in the model's order, NaN where absent (an id the model
        was not trained on is ignored, as `predict` ignores it)."""
        out = np.full(len(index), np.nan, np.float32)
        for fid, value in features.items():
            j = index.get(fid)
            if j is not None:
                out[j] = value
        return out

    def describe(self) -> dict[str, Any]:
        """What `GET /v1/model` shows about the model."""
        out: dict[str, Any] = {
            "model_id": self.model_id,
            "kind": self.kind,
            "state_feature_ids": self.state_ids,
            "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at)),
        }
        if self.kind == "dqn":
            out["actions"] = self.actions
        else:
            out["action_feature_ids"] = self.action_ids
        return out


def files_key(directory: Path) -> FilesKey:
    """The identity of the model files (inode, size, mtime): a trainer's atomic rename
    changes it; None for a missing file."""
    key: list[tuple[int, int, int] | None] = []
    for name in MODEL_FILES:
        try:
            st = os.stat(directory / name)
        except OSError:
            key.append(None)
        else:
            key.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(key)


def load_model_files(directory: Path) -> LoadedModel:
    """The model in `directory`; `ConfigError` (naming `--model`) when it is missing,
    damaged, not a pair, of a kind that cannot be served, or replaced while loading."""
    from reagent_lite.predict import Predictor

    if directory.is_file():
        directory = directory.parent
    before = files_key(directory)
    predictor = Predictor(directory)
    if files_key(directory) != before:  # the pair checked may not be the pair loaded
        raise ConfigError(
            f"--model: the files in '{directory}' changed while they were loaded (a new model"
            " being written): try again"
        )
    space = predictor.space
    if predictor.kind.name not in SERVED_KINDS:
        raise ConfigError(
            f"--model: '{directory}' holds a {predictor.kind.name} model; serving takes"
            f" {' or '.join(SERVED_KINDS)} models"
        )
    actions = list(space.actions) if isinstance(space, DiscreteSpace) else []
    action_ids = list(space.action_ids) if isinstance(space, ParametricSpace) else []
    return LoadedModel(
        model_id=str(predictor.meta["model_sha256"]),
        kind=predictor.kind.name,
        program=predictor.program,
        state_ids=list(space.state_ids),
        actions=actions,
        action_ids=action_ids,
        loaded_at=time.time(),
        files=before,
        state_index={fid: j for j, fid in enumerate(space.state_ids)},
        action_index={name: j for j, name in enumerate(actions or action_ids)},
    )
