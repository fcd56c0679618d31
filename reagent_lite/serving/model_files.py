"""The model a policy serves, loaded from a run's `model_output_path` as `predict` loads it
(model_meta.json's digest checked against model.pt2, the program's signature against the
meta), plus what acting needs: the state's feature positions, the kind's serving part
(`acting`, resolved once here from the kind model_meta.json names) and the model's id."""

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
from reagent_lite.kinds.serving import Acting, NotServed, feature_row

# The two files a model is: a new model has landed when either changes.
MODEL_FILES = ("model.pt2", "model_meta.json")
FilesKey = tuple[tuple[int, int, int] | None, ...]


@dataclass(frozen=True)
class LoadedModel:
    model_id: str  # model.pt2's SHA-256, as model_meta.json names (and loading checked) it
    kind: str  # the registered kind's name (resolved once, into `acting`)
    program: Callable[..., torch.Tensor]
    state_ids: list[str]
    acting: Acting  # the kind's serving part, for this model's actions
    loaded_at: float  # time.time()
    files: FilesKey  # the files' identity when loaded
    state_index: dict[str, int]  # state feature id → column

    def state_row(self, features: Mapping[str, float]) -> np.ndarray:
        """`features` as one row in the model's order, NaN where absent (an id the model
        was not trained on is ignored, as `predict` ignores it)."""
        return feature_row(features, self.state_index)

    def describe(self) -> dict[str, Any]:
        """What `GET /v1/model` shows about the model."""
        return {
            "model_id": self.model_id,
            "kind": self.kind,
            "state_feature_ids": self.state_ids,
            "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at)),
            **self.acting.describe(),
        }


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
    from reagent_lite.kinds import served_kinds
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
    try:
        acting = predictor.kind.acting(space)
    except NotServed:
        raise ConfigError(
            f"--model: '{directory}' holds a {predictor.kind.name} model; serving takes"
            f" {' or '.join(served_kinds())} models"
        ) from None
    return LoadedModel(
        model_id=str(predictor.meta["model_sha256"]),
        kind=predictor.kind.name,
        program=predictor.program,
        state_ids=list(space.state_ids),
        acting=acting,
        loaded_at=time.time(),
        files=before,
        state_index={fid: j for j, fid in enumerate(space.state_ids)},
    )
