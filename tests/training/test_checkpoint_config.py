"""Which config differences stop `--resume`: a key a later version removed is not one of
them (a checkpoint written before still records it, and the config cannot set it now)."""

from __future__ import annotations

from reagent_lite.config.loader import REMOVED_KEYS
from reagent_lite.training.checkpoint import config_changes


def _config(**step_plan: str) -> dict:
    return {
        "epochs": 3,
        "training": {"learning_rate": 0.001, "step_plan": {"compile_cache": "auto", **step_plan}},
    }


def test_a_checkpoint_recording_a_removed_key_still_resumes() -> None:
    assert "training.step_plan.p2p_allreduce" in REMOVED_KEYS
    saved = _config(p2p_allreduce="auto")  # what a checkpoint from before the removal holds
    assert config_changes(saved, _config()) == []


def test_a_real_change_is_still_named_beside_a_removed_key() -> None:
    saved = _config(p2p_allreduce="auto")
    current = _config(compile_cache="off")
    current["epochs"] = 5  # resumable: not named
    assert config_changes(saved, current) == ["training.step_plan.compile_cache ('auto' -> 'off')"]
