"""Workflow configs: Pydantic models, JSON loading with Horizon migration, schema export.

Importing this package does not import torch (configs are checked before anything heavy).
"""

from reagent_lite.config.loader import (
    config_class,
    config_from_dict,
    format_validation_error,
    load_config,
    migrate_horizon,
)
from reagent_lite.config.models import (
    BaseWorkflowConfig,
    DQNWorkflowConfig,
    EvaluationParameters,
    MlflowParameters,
    NormalizationOverrides,
    NormParams,
    ParametricDQNWorkflowConfig,
    RainbowParameters,
    RLParameters,
    SampleDataParameters,
    TrainingParameters,
    WorkflowConfig,
)

__all__ = [
    "BaseWorkflowConfig",
    "DQNWorkflowConfig",
    "EvaluationParameters",
    "MlflowParameters",
    "NormParams",
    "NormalizationOverrides",
    "ParametricDQNWorkflowConfig",
    "RLParameters",
    "RainbowParameters",
    "SampleDataParameters",
    "TrainingParameters",
    "WorkflowConfig",
    "config_class",
    "config_from_dict",
    "format_validation_error",
    "load_config",
    "migrate_horizon",
]
