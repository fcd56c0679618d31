"""Pydantic models of the workflow configs (key names follow ReAgent/Horizon's JSON workflows).

Every model is frozen, strict (JSON types only: `"256"` is not an int) and forbids unknown
keys; every field carries a description, which flows into the JSON Schema in `schemas/`.
Paths are kept as written; relative ones resolve against the current working directory
of the process that reads the config (`resolved()` turns them into absolute paths once).

Cross-field problems are raised as `ConfigProblem`s so that the loader can point at the
exact JSON path (`training.layers[2]`) rather than at the enclosing object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import Self

from reagent_lite.io_utils import check_path_length

ACTIVATIONS = frozenset(
    {"relu", "tanh", "sigmoid", "leaky_relu", "elu", "gelu", "selu", "linear", "identity"}
)
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")


class ConfigProblem(ValueError):
    """A semantic problem at `path` (relative to the model that raised it).

    Pydantic keeps the raised exception in the error's context, so the loader can extend
    the error location with `path` and report `value` as what it got.
    """

    def __init__(self, path: tuple[str | int, ...], message: str, value: Any = None) -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.value = value


def _int_to_bool(value: Any) -> Any:
    # Horizon wrote flags as 0/1; accept exactly those two integers, nothing looser.
    if type(value) is int and value in (0, 1):
        return bool(value)
    return value


# A bool that also accepts Horizon's 0/1 (the schema says so too, so editors agree).
FlexBool = Annotated[
    bool,
    BeforeValidator(_int_to_bool),
    WithJsonSchema({"anyOf": [{"type": "boolean"}, {"enum": [0, 1]}]}),
]


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


OptimizerName = Annotated[
    Literal["adam", "adamw", "sgd", "rmsprop"],
    BeforeValidator(_lower),
    WithJsonSchema({"enum": [*OPTIMIZERS, *(o.upper() for o in OPTIMIZERS)], "type": "string"}),
]


MAX_READ_AHEAD = 64


def _read_ahead(value: Any) -> Any:
    # One message for both branches of the union ("auto" or a count), naming what is valid.
    if value == "auto" or (type(value) is int and 1 <= value <= MAX_READ_AHEAD):
        return value
    raise ConfigProblem((), f'expected "auto" or an integer from 1 to {MAX_READ_AHEAD}', value)


ReadAhead = Annotated[
    int | Literal["auto"],
    BeforeValidator(_read_ahead),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_READ_AHEAD}, {"const": "auto"}]}
    ),
]

# Upper bounds that no real run reaches and that keep arithmetic and allocations sane
# (a layer of 1e10 units, a batch of 2^40 rows or a 1e300 s timeout fail here, not mid-run).
MAX_WIDTH = 1 << 20
MAX_ROWS_PER_BATCH = 1 << 24
MAX_COUNT = 1 << 40
MAX_TIMEOUT_S = 30 * 24 * 3600.0
MAX_PATH = 4096  # Linux's PATH_MAX


class _Model(BaseModel):
    # No NaN or infinity anywhere: `1e400` parses as inf, and an infinite timeout waits
    # forever.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class RLParameters(_Model):
    """Reinforcement-learning parameters (Horizon's `rl` block)."""

    gamma: float = Field(default=0.99, ge=0.0, le=1.0, description="Discount factor, 0 ≤ γ ≤ 1.")
    target_update_rate: float = Field(
        default=0.01,
        gt=0.0,
        le=1.0,
        description="Soft target-network update rate τ (0 < τ ≤ 1; 1 copies the network).",
    )
    maxq_learning: FlexBool = Field(
        default=True,
        description="Q-learning (max over possible next actions) if true, SARSA (the logged "
        "next action) if false. Accepts Horizon's 0/1.",
    )
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        description="Softmax temperature (> 0) of the policy CPE evaluates when "
        "evaluation.policy is 'softmax'; no effect with the default greedy policy.",
    )
    # Literal defaults (pydantic copies mutable ones for every model) so that the JSON
    # Schema states them; a default_factory would leave them out.
    reward_boost: dict[str, float] = Field(
        default={},
        description="Action name → reward added to transitions that took that action.",
    )
    use_seq_num_diff_as_time_diff: FlexBool = Field(
        default=False,
        description="Use the sequence-number gap between steps as time_diff (discount γ^Δ).",
    )
    q_network_loss: Literal["mse", "huber"] = Field(
        default="mse", description="TD loss: mean squared error or Huber (smooth L1)."
    )
    softmax_policy: FlexBool = Field(
        default=False,
        description="Horizon compatibility (accepts 0/1), no effect: model.pt2 returns Q "
        "values and counterfactual evaluation values evaluation.policy (set it to 'softmax' "
        "to evaluate softmax(Q / rl.temperature)); true warns.",
    )
    epsilon: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Horizon compatibility: the exploration ε of Horizon's online trainers. "
        "Offline training and evaluation do not explore, so a value above 0 warns and is "
        "otherwise ignored.",
    )


class RainbowParameters(_Model):
    """Rainbow DQN switches (Horizon's `rainbow` block)."""

    double_q_learning: bool = Field(
        default=True, description="Double Q-learning: the online network picks the next action."
    )
    dueling_architecture: bool = Field(
        default=False, description="Dueling value/advantage heads (discrete actions only)."
    )
    bcq_drop_threshold: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Discrete BCQ (dqn workflow only), a conservative alternative to "
        "training.cql_alpha: an imitation network learns the logged actions in the same "
        "optimizer step as the Q-network, and an action whose imitation probability is "
        "below this fraction of the state's most likely action's is dropped from the "
        "next-state max and from the served policy (model.pt2 returns the lowest float "
        "for it). In (0, 1), e.g. 0.3; null = off.",
    )


Precision = Literal["fp32", "tf32", "bf16"]
# A speed-up's switch: where measured faster / wherever it can run (else a warning) / never.
Switch = Literal["auto", "on", "off"]


class StepVariants(_Model):
    """`training.step_variants`: the faster forms of the networks' forward that a compiled
    step (`training.compile`) traces; each gives the plain forward's values. `auto` takes
    a form where it was measured faster; `off` keeps the plain form."""

    pad_first_layer: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Zero-pad a first layer's rows to 16 bytes (zero weight columns) where "
        "the product runs on TF32 tensor cores (precision tf32 on CUDA), so that cuBLAS "
        "takes aligned kernels. auto: compiled CUDA steps; on: the same, with a warning "
        "where it cannot run; off: never. IEEE fp32 products are never padded, nor bf16 "
        "ones (measured under 5% faster).",
    )
    output_sum: Literal["auto", "off"] = Field(
        default="auto",
        description="Trace an output layer of up to 4 outputs as a product and a sum, which "
        "Inductor fuses with the activation before it. auto: every compiled step; off: the "
        "matrix product (a 4-GPU run of the sum once scaled poorly on one host).",
    )
    candidate_kernel: Switch = Field(
        default="auto",
        description="Score a parametric candidate set without gradient (double Q's next "
        "candidate) with one Triton kernel for the first layer and its ReLU. auto: compiled "
        "CUDA steps where Triton is installed; on: the same, with a warning where it cannot "
        "run (no CUDA, no Triton, compile off); off: the plain layer.",
    )


class StepPlanParameters(_Model):
    """`training.step_plan`: the step's speed-ups outside the networks' forward. `auto`
    takes one where it was measured faster and says in the step's log line why not
    elsewhere; `on` also warns when it cannot be taken; `off` keeps the plain path."""

    compile_cache: Switch = Field(
        default="auto",
        description="Let a compiled step (training.compile) load and store torch's on-disk "
        "cache of compiled forward/backward graphs (AOTAutograd's, under the Inductor cache "
        "directory): a faster start, at a price measured on H200s: an entry a one-GPU run "
        "wrote made a later two-GPU run's step 2.5x slower, and a two-GPU run's own entry "
        "11% slower than compiling with the cache off. auto: off for a compiled CUDA step, "
        "on elsewhere; on: the cache; off: compiled afresh every run (Inductor's kernel "
        "cache still serves).",
    )
    keep_freed_memory: Switch = Field(
        default="auto",
        description="Keep freed host memory for reuse between steps (glibc mallopt: mmap "
        "threshold 32 MiB, trim threshold 512 MiB), so that a CPU step's activations are "
        "not page-faulted in again every step. auto: CPU runs, unless an allocator is "
        "preloaded or glibc's malloc tunables are set; on: GPU runs too, with a warning "
        "where it cannot be set; off: malloc left alone.",
    )


class TrainingParameters(_Model):
    """Network shape and optimizer (Horizon's `training` block)."""

    layers: list[Annotated[int, Field(ge=-1, le=MAX_WIDTH)]] = Field(
        default=[-1, 256, 256, -1],
        min_length=2,
        description="Layer sizes, input first. A -1 at the first/last position is a "
        "placeholder for the input size / output size taken from the data; -1 anywhere "
        "else is an error.",
    )
    activations: list[str] = Field(
        default=["relu", "relu", "linear"],
        description="Activation after each linear layer (len(layers) - 1 entries), one of "
        + ", ".join(sorted(ACTIVATIONS))
        + " (case-insensitive; linear = identity). Unset: relu after each hidden layer and "
        "linear after the last, as many as layers needs.",
    )
    minibatch_size: int = Field(
        default=1024,
        ge=1,
        le=MAX_ROWS_PER_BATCH,
        description="Minibatch size per process (not multiplied by GPU count).",
    )
    learning_rate: float = Field(default=1e-3, gt=0.0, description="Optimizer learning rate (> 0).")
    optimizer: OptimizerName = Field(
        default="adam", description="Optimizer: adam, adamw, sgd or rmsprop (case-insensitive)."
    )
    l2_decay: float = Field(default=0.0, ge=0.0, description="L2 weight decay (≥ 0).")
    lr_decay: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Multiplicative learning-rate decay applied after each epoch (0 < d ≤ 1).",
    )
    clip_grad_norm: float | None = Field(
        default=None,
        gt=0.0,
        description="Clip the gradient norm to this value (null = no clipping).",
    )
    dropout_ratio: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout probability after hidden layers (0 ≤ p < 1).",
    )
    layer_norm: bool = Field(default=False, description="LayerNorm after each hidden linear layer.")
    warm_start_model_path: str | None = Field(
        max_length=MAX_PATH,
        default=None,
        min_length=1,
        description="Checkpoint to initialise the Q-network from (relative to the working "
        "directory).",
    )
    minibatches_per_step: int = Field(
        default=1,
        ge=1,
        le=65_536,
        description="Gradient-accumulation minibatches per optimizer step.",
    )
    cql_alpha: float = Field(
        default=0.0, ge=0.0, description="Conservative Q-learning regulariser weight (0 = off)."
    )
    cql_weighting: Literal["constant", "behavior_entropy", "certainty_switch"] = Field(
        default="constant",
        description="How the CQL penalty is weighted per logged row (dqn workflow only). "
        "constant: cql_alpha everywhere. behavior_entropy: cql_alpha × w(s), w(s) = 1 − "
        "H(π_b(·|s)) / log(possible actions), π_b an imitation network trained on the "
        "logged actions in the same step: full penalty where the logger was sure of its "
        "action, none where it chose uniformly at random (where no action is out of the "
        "data). certainty_switch: cql_alpha on every row when the top 1% of the batch's "
        "rows by w reach w ≥ 0.1 (the logger was sure somewhere), else 0 (plain double DQN "
        "on logs chosen uniformly at random); full cql_alpha through the first 200 "
        "optimizer steps, while the imitator is untrained. Needs cql_alpha > 0.",
    )
    export_diverged_model: bool = Field(
        default=False,
        description="Write model.pt2 even when the run ends with its Q-values diverging "
        "(q_diverging in the last epoch's record). Off: such a run keeps its checkpoints, "
        "writes no model and exits 5 naming the remedy.",
    )
    steps_per_epoch: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="Optimizer steps per epoch, identical on every rank (null = one pass "
        "over the largest shard).",
    )
    scale_lr_with_world_size: bool = Field(
        default=False, description="Multiply learning_rate by the world size (linear scaling rule)."
    )
    precision: Precision = Field(
        default="fp32",
        description="Arithmetic of the training step. fp32: full float32 (unchanged maths). "
        "tf32: float32 matrix products on TensorFloat-32 tensor cores (CUDA only; on a CPU "
        "the step stays fp32). bf16: the step's forward passes under bfloat16 autocast, "
        "with float32 weights, loss, gradients and optimizer state. Evaluation, CPE and "
        "the exported model are always float32.",
    )
    compile: bool = Field(
        default=False,
        description="Compile the loss's forward and backward with torch.compile (Inductor), "
        "the CPE side models' loss included, so that they run as a few fused kernels, inside "
        "the CUDA graph when cuda_graphs is on; under a CUDA graph the optimizer step and "
        "soft target update are compiled too. "
        "Costs a compilation of tens of seconds at the start of a run (cached by "
        "torch across runs); worth it for long runs, mostly on GPU. Falls back to the "
        "plain step, with a warning, if compilation fails.",
    )
    step_variants: StepVariants = Field(
        default_factory=StepVariants,
        description="With compile: the faster forms of the forward the compiled step traces "
        "(the step's log line names those taken).",
    )
    step_plan: StepPlanParameters = Field(
        default_factory=StepPlanParameters,
        description="The step's speed-ups outside the forward: the GPUs' gradient sum and "
        "host memory reuse (the step's log line and the first epoch's metrics.jsonl record "
        "name every choice taken, and why not).",
    )

    @model_validator(mode="before")
    @classmethod
    def _activations_follow_layers(cls, data: object) -> object:
        # A fixed default list would only fit the default depth: `layers=[-1, 64, -1]`
        # alone must not fail on activations the user never wrote.
        if isinstance(data, dict) and "activations" not in data:
            layers = data.get("layers")
            if isinstance(layers, list) and len(layers) >= 2:
                data = {**data, "activations": ["relu"] * (len(layers) - 2) + ["linear"]}
        return data

    @field_validator("activations")
    @classmethod
    def _known_activations(cls, value: list[str]) -> list[str]:
        out = []
        for i, name in enumerate(value):
            if name.lower() not in ACTIVATIONS:
                raise ConfigProblem(
                    (i,), f"unknown activation; expected one of {sorted(ACTIVATIONS)}", name
                )
            out.append(name.lower())
        return out

    @model_validator(mode="after")
    def _shape(self) -> TrainingParameters:
        last = len(self.layers) - 1
        for i, size in enumerate(self.layers):
            if size == -1 and 0 < i < last:
                raise ConfigProblem(
                    ("layers", i),
                    "-1 is only allowed as the first or last entry (input/output placeholder)",
                    size,
                )
            if size == 0:
                raise ConfigProblem(("layers", i), "layer sizes must be positive or -1", size)
        if len(self.activations) != len(self.layers) - 1:
            raise ConfigProblem(
                ("activations",),
                f"needs len(layers) - 1 = {len(self.layers) - 1} entries, one per linear "
                f"layer, but has {len(self.activations)}",
                self.activations,
            )
        return self


class EvaluationParameters(_Model):
    """Counterfactual policy evaluation and model selection."""

    calc_cpe_in_training: bool = Field(
        default=True,
        description="Run counterfactual policy evaluation on eval data after each epoch.",
    )
    bootstrap_samples: int = Field(
        default=200,
        ge=0,
        le=100_000,
        description="Bootstrap resamples for CPE standard errors (0 = none).",
    )
    online_episodes: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="If > 0, roll the exported model out for this many episodes in the "
        "environment of `sample_data` (requires a sample_data block).",
    )
    policy: Literal["greedy", "softmax"] = Field(
        default="greedy",
        description="The policy CPE evaluates: 'greedy' is what model.pt2 serves (argmax of "
        "Q over each row's candidates, ties to the first); 'softmax' is softmax(Q / "
        "rl.temperature) over the candidates (ReAgent's evaluated policy), which nobody "
        "serves. metrics.jsonl, model_meta.json and the report name the one evaluated.",
    )
    model_selection: Literal["last", "td_error", "cpe"] = Field(
        default="last",
        description="Which epoch's model is exported: the last, the lowest eval TD error, "
        "or the best CPE estimate (doubly robust, of evaluation.policy).",
    )


class SampleDataParameters(_Model):
    """Generate logged data when `training_data_path` does not exist (rank 0, before training)."""

    kind: Literal["gym", "synthetic_parametric"] = Field(
        default="gym",
        description="gym: log episodes of a gymnasium env; synthetic_parametric: a synthetic "
        "environment whose actions are feature vectors (parametric_dqn only).",
    )
    env: str = Field(default="CartPole-v1", description="gymnasium environment id (kind = gym).")
    episodes: int = Field(
        default=200, ge=1, le=100_000_000, description="Number of episodes to log."
    )
    policy: Literal["random", "epsilon_greedy"] = Field(
        default="random", description="Logging policy: uniform random or ε-greedy."
    )
    epsilon: float = Field(
        default=0.1, ge=0.0, le=1.0, description="ε of the epsilon_greedy logging policy."
    )
    random_episode_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Fraction of the episodes played uniformly at random instead of by "
        "`policy` (drawn per episode; each row's propensity is that of the policy that "
        "played it): logs of a mix of behaviours (kind = gym).",
    )
    seed: int = Field(default=0, description="Seed of the environment and the logging policy.")
    eval_fraction: float = Field(
        default=0.1,
        ge=0.0,
        lt=1.0,
        description="Fraction of episodes written to eval_data_path instead of training.",
    )


class NormParams(_Model):
    """Horizon's `norm_params` block: only `num_samples` has an effect here."""

    output_dir: str | None = Field(
        max_length=MAX_PATH,
        default=None,
        description="Horizon compatibility only (ignored): normalization is written into "
        "model_output_path.",
    )
    cols_to_norm: list[str] | None = Field(
        default=None,
        description="Horizon compatibility only (ignored): the state (and, for parametric, "
        "action) feature columns are always normalized.",
    )
    num_samples: int | None = Field(
        default=None,
        ge=1,
        description="Rows sampled to fit normalization; sets normalization_sample_size when "
        "that is not given.",
    )


FeatureTypeName = Literal[
    "BINARY",
    "PROBABILITY",
    "CONTINUOUS",
    "BOXCOX",
    "QUANTILE",
    "ENUM",
    "CONTINUOUS_ACTION",
    "DO_NOT_PREPROCESS",
]


class NormalizationOverrides(_Model):
    """Normalization types forced per feature id instead of the identified ones (ReAgent's
    feature overrides), e.g. an hour of day identified as PROBABILITY or ENUM."""

    state: dict[str, FeatureTypeName] = Field(
        default={},
        description='State feature id → normalization type, e.g. {"7": "CONTINUOUS"}.',
    )
    action: dict[str, FeatureTypeName] = Field(
        default={},
        description="parametric_dqn: action feature id → normalization type (the default "
        "for action features is CONTINUOUS_ACTION; BINARY for one seen with one value or with "
        "0/1 values).",
    )

    @field_validator("state", "action")
    @classmethod
    def _feature_ids(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.isdigit():
                raise ConfigProblem((key,), "feature ids are strings of non-negative integers", key)
        return value

    def for_group(self, group: str) -> dict[str, str]:
        """The overrides of a preprocessor group ("state" or "action")."""
        return dict(self.state if group == "state" else self.action)


class MlflowParameters(_Model):
    """Where an MLflow run logs (the `mlflow` extra)."""

    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI, e.g. file:///shared/mlruns or http://host:5000 "
        "(default: MLflow's own: $MLFLOW_TRACKING_URI, else ./mlruns).",
    )
    experiment_name: str = Field(
        default="reagent-lite", min_length=1, description="MLflow experiment to log into."
    )
    run_name: str | None = Field(
        default=None, description="Name of the MLflow run (default: MLflow's generated one)."
    )


def _check_file_url(value: str) -> None:
    if not value.startswith("file://"):
        raise ConfigProblem((), "must be a file:// URL on a filesystem all nodes share", value)
    path = value[len("file://") :]
    if not path.startswith("/"):
        raise ConfigProblem(
            (), "must be an absolute file URL such as file:///shared/dir/rendezvous", value
        )
    if path.rstrip("/") == "":
        raise ConfigProblem((), "names no file", value)


class BaseWorkflowConfig(_Model):
    """What both workflows share."""

    training_data_path: str = Field(
        max_length=MAX_PATH,
        min_length=1,
        description="Training table: a Parquet/JSONL file or a directory of part files "
        "(relative paths resolve against the current working directory).",
    )
    eval_data_path: str | None = Field(
        max_length=MAX_PATH,
        default=None,
        min_length=1,
        description="Evaluation table for CPE (null = no counterfactual evaluation).",
    )
    state_norm_data_path: str | None = Field(
        max_length=MAX_PATH,
        default=None,
        min_length=1,
        description="State normalization JSON; null = fit it from the data and write it into "
        "model_output_path.",
    )
    model_output_path: str = Field(
        max_length=MAX_PATH,
        min_length=1,
        description="Output directory (model.pt2, model_meta.json, metrics, checkpoints).",
    )
    overwrite: bool = Field(
        default=False,
        description="Let a fresh run replace the finished model in model_output_path "
        "(model.pt2 + model_meta.json); without it (or --overwrite) such a run is refused.",
    )
    use_gpu: bool | Literal["auto"] = Field(
        default="auto",
        description='"auto": train on CUDA when a GPU is visible, else on CPU without a '
        "warning. true: ask for a GPU (on CPU, with a warning, when none is visible). "
        "false: CPU.",
    )
    use_all_avail_gpus: bool = Field(
        default=True, description="Start one process per visible GPU on each node (DDP)."
    )
    num_nodes: int = Field(
        default=1,
        ge=1,
        le=65_536,
        description="Number of machines; each is started with --node_index=n.",
    )
    init_method: str | None = Field(
        max_length=MAX_PATH,
        default=None,
        description="file:///absolute/path of the rendezvous file on a filesystem all nodes "
        "share. Required when num_nodes > 1. When null and one node runs several processes "
        "(use_all_avail_gpus with several GPUs), it defaults at launch to the file "
        "'.rendezvous' inside model_output_path.",
        json_schema_extra={"pattern": "^file:///"},
    )
    epochs: int = Field(
        default=10, ge=1, le=MAX_COUNT, description="Passes over the data (see steps_per_epoch)."
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="Seed for initialisation, shuffling and sampling (0 ≤ seed < 2^32).",
    )
    rendezvous_timeout_s: float = Field(
        default=600,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Seconds a node waits for the other nodes to arrive.",
    )
    collective_timeout_s: float = Field(
        default=1800,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Seconds a rank waits on a dead peer mid-training.",
    )
    checkpoint_every_epochs: int = Field(
        default=1, ge=0, description="Write a checkpoint every this many epochs (0 = never)."
    )
    checkpoint_every_steps: int = Field(
        default=0,
        ge=0,
        le=2**40,
        description="Also write a mid-epoch checkpoint every this many optimizer steps "
        "(0 = never): a killed run loses at most that many steps.",
    )
    checkpoint_every_minutes: float = Field(
        default=0,
        ge=0,
        le=525_600,
        allow_inf_nan=False,
        description="Also write a mid-epoch checkpoint when this many minutes passed since "
        "the last one (0 = never); checked every stop_check_every_steps steps.",
    )
    stop_check_every_steps: int = Field(
        default=10,
        ge=1,
        le=1_000_000,
        description="How often (in optimizer steps) the ranks agree whether to stop on "
        "SIGTERM/SIGINT or to write a clock-based checkpoint: one small all-reduce each "
        "time (a single process checks every step).",
    )
    log_every_steps: int = Field(
        default=100, ge=1, description="Log the loss every this many steps."
    )
    device_resident_data: bool = Field(
        default=True, description="Keep each rank's shard on its device (fast path when it fits)."
    )
    stream_from_disk: bool = Field(
        default=False,
        description="Never hold a rank's whole shard: each epoch read its Parquet row groups "
        "in a seeded shuffled order, a window of at most stream_window_rows rows at a time "
        "(the next windows, stream_read_ahead of them, are read in the background while "
        "training on the current one). "
        "For shards larger than host memory; both workflows, Parquet data only. Trade-off: "
        "shuffling is window-local — a minibatch mixes only the rows of the row groups in "
        "its window — and normalization (unless given) is fitted on a sample of row groups. "
        "Overrides device_resident_data for the training data; eval data is read as usual.",
    )
    stream_window_rows: int = Field(
        default=1_000_000,
        ge=1,
        le=MAX_COUNT,
        description="With stream_from_disk: rows per window (whole row groups are packed up "
        "to this; a larger row group is a window alone). Memory is at most about "
        "stream_read_ahead + 2 windows of training tensors: host memory, or on a GPU device "
        "memory where they fit in half of it (the host then holds only the windows being "
        "loaded); larger windows shuffle more globally.",
    )
    stream_read_ahead: ReadAhead = Field(
        default="auto",
        description="With stream_from_disk: window loads kept in flight ahead of the window "
        "being trained on (each adds about one window to memory: about "
        'stream_read_ahead + 2 windows in all). "auto": 1 when training on the CPU (the '
        "loaders would take its cores); on a GPU one load per 4 of the rank's cores (the host's, within its CPU mask "
        "and cgroup quota, shared among the node's ranks; each "
        "load runs up to 4 threads), at least 1 and at most 3. The "
        "chunks trained on are the same for every value.",
    )
    stream_prepare: bool = Field(
        default=True,
        description="With stream_from_disk: decode, validate, tensorize and normalize each "
        "row group once and keep the result as fixed-width arrays in stream_prepared_dir, "
        "which every later window, epoch and run on the same data and config memory-maps "
        "instead of decoding Parquet again (rebuilt when the data's bytes, the feature "
        "space, the normalization or the code change). false: decode every window from "
        "Parquet.",
    )
    stream_prepared_dir: str | None = Field(
        default=None,
        description="With stream_prepare: where prepared row groups are kept (one "
        "subdirectory per data config; delete it to reclaim the space). null: "
        "$REAGENT_LITE_PREPARED_DIR, else $XDG_CACHE_HOME/reagent-lite/prepared "
        "(~/.cache/reagent-lite/prepared). A node-local disk is fastest.",
    )
    cuda_graphs: bool = Field(
        default=True, description="Capture the training step in a CUDA graph when on GPU."
    )
    data_parallel: Literal["ddp", "dp"] = Field(
        default="ddp",
        description="ddp: one process per GPU (default); dp: one process with DataParallel "
        "(single node only).",
    )
    normalization_sample_size: int = Field(
        default=100000,
        ge=1,
        le=MAX_COUNT,
        description="Rows sampled to identify and fit feature normalization.",
    )
    drop_bad_rows: bool = Field(
        default=False, description="Drop (and count) invalid data rows instead of failing."
    )
    null_propensity: Literal["error", "one"] = Field(
        default="error",
        description="A null action_probability: a bad row (error), or 1.0 — a deterministic "
        "logging policy, as Horizon logged it — with the count logged (one).",
    )
    rl: RLParameters = Field(default_factory=lambda: RLParameters(), description="RL parameters.")
    rainbow: RainbowParameters = Field(
        default_factory=lambda: RainbowParameters(), description="Rainbow DQN switches."
    )
    training: TrainingParameters = Field(
        default_factory=lambda: TrainingParameters(), description="Network and optimizer."
    )
    evaluation: EvaluationParameters = Field(
        default_factory=lambda: EvaluationParameters(), description="Counterfactual evaluation."
    )
    sample_data: SampleDataParameters | None = Field(
        default=None, description="Generate the data when training_data_path does not exist."
    )
    norm_params: NormParams | None = Field(
        default=None, description="Horizon's norm_params (num_samples sets the sample size)."
    )
    normalization_overrides: NormalizationOverrides = Field(
        default_factory=lambda: NormalizationOverrides(),
        description="Normalization types forced per feature id when the normalization is "
        "fitted (not applied to a given state_norm_data_path / action_norm_data_path).",
    )
    mlflow: MlflowParameters | None = Field(
        default=None,
        description="Log the config as params, every metrics.jsonl record as metrics and the "
        "output files (not checkpoints/) as artifacts to MLflow (needs the mlflow extra); "
        "null: off.",
    )
    tensorboard: bool = Field(
        default=False,
        description="Also write the metrics as TensorBoard event files to "
        "model_output_path/tensorboard/ (needs the tensorboard extra).",
    )

    @model_validator(mode="before")
    @classmethod
    def _norm_params_sample_size(cls, data: Any) -> Any:
        # Horizon's norm_params.num_samples sets the sample size unless given explicitly.
        if isinstance(data, dict) and "normalization_sample_size" not in data:
            norm = data.get("norm_params")
            if isinstance(norm, dict) and type(norm.get("num_samples")) is int:
                data = {**data, "normalization_sample_size": norm["num_samples"]}
        return data

    @field_validator("init_method")
    @classmethod
    def _file_url(cls, value: str | None) -> str | None:
        if value is not None:
            _check_file_url(value)
        return value

    @model_validator(mode="after")
    def _launch(self) -> BaseWorkflowConfig:
        if self.num_nodes > 1 and self.init_method is None:
            raise ConfigProblem(
                ("init_method",),
                f"required when num_nodes > 1 (num_nodes = {self.num_nodes}): a "
                "file:///... URL on a filesystem all nodes share",
                None,
            )
        if self.data_parallel == "dp" and self.num_nodes > 1:
            raise ConfigProblem(
                ("data_parallel",), "'dp' runs on a single node; use 'ddp'", self.data_parallel
            )
        if self.evaluation.online_episodes > 0 and self.sample_data is None:
            raise ConfigProblem(
                ("evaluation", "online_episodes"),
                "needs a sample_data block naming the environment to roll out in",
                self.evaluation.online_episodes,
            )
        return self

    def resolved(self, base: Path | None = None) -> Self:
        """A copy whose relative paths are made absolute against `base` (default: cwd)."""
        root = (base or Path.cwd()).resolve()

        def fix(key: str, p: str | None) -> str | None:
            if p is None:
                return None
            check_path_length(key, str(root / Path(p).expanduser()))  # before it is touched
            return str((root / Path(p).expanduser()).resolve())

        names = self._path_fields()
        update: dict[str, Any] = {name: fix(name, getattr(self, name)) for name in names}
        if self.training.warm_start_model_path is not None:
            start = fix("training.warm_start_model_path", self.training.warm_start_model_path)
            update["training"] = self.training.model_copy(update={"warm_start_model_path": start})
        fix("stream_prepared_dir", self.stream_prepared_dir)
        return self.model_copy(update=update)

    def _path_fields(self) -> list[str]:
        return [
            "training_data_path",
            "eval_data_path",
            "state_norm_data_path",
            "model_output_path",
        ]

    def logs_actions_as_features(self) -> bool:
        """Whether generated gym sample data logs each action as a feature map (the
        workflows whose actions are feature vectors) rather than by name."""
        return False

    def optional_inputs(self) -> dict[str, str | None]:
        """The optional input files of this workflow, by config key."""
        return {
            "eval_data_path": self.eval_data_path,
            "state_norm_data_path": self.state_norm_data_path,
        }


class DQNWorkflowConfig(BaseWorkflowConfig):
    """Discrete-action DQN workflow (`python -m workflows.dqn_workflow`)."""

    model_config = ConfigDict(title="DQN workflow config")

    workflow: Literal["dqn"] = Field(
        default="dqn",
        description="Which workflow this config is for (lets tools tell configs apart).",
    )
    actions: list[Annotated[str, Field(max_length=1024)]] = Field(
        min_length=1,
        max_length=65_536,
        description="Action names, as logged in the data's `action` column.",
    )

    @field_validator("actions")
    @classmethod
    def _unique_actions(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for i, name in enumerate(value):
            if name == "":
                raise ConfigProblem((i,), "action names must be non-empty", name)
            if name in seen:
                raise ConfigProblem((i,), "duplicate action name", name)
            seen.add(name)
        return value

    @model_validator(mode="after")
    def _actions_consistent(self) -> DQNWorkflowConfig:
        for name in self.rl.reward_boost:
            if name not in self.actions:
                raise ConfigProblem(
                    ("rl", "reward_boost", name),
                    f"not one of the actions {self.actions}",
                    name,
                )
        last = self.training.layers[-1]
        if last not in (-1, len(self.actions)):
            raise ConfigProblem(
                ("training", "layers", len(self.training.layers) - 1),
                f"output size must be -1 or the number of actions ({len(self.actions)})",
                last,
            )
        if self.sample_data is not None and self.sample_data.kind != "gym":
            raise ConfigProblem(
                ("sample_data", "kind"),
                "the dqn workflow needs gym sample data",
                self.sample_data.kind,
            )
        if self.training.cql_weighting != "constant" and self.training.cql_alpha <= 0.0:
            raise ConfigProblem(
                ("training", "cql_weighting"),
                "weights the CQL penalty, so it needs training.cql_alpha > 0 "
                f"(got cql_alpha {self.training.cql_alpha})",
                self.training.cql_weighting,
            )
        return self


class ParametricDQNWorkflowConfig(BaseWorkflowConfig):
    """Parametric-action DQN workflow (`python -m workflows.parametric_dqn_workflow`)."""

    model_config = ConfigDict(title="Parametric DQN workflow config")

    workflow: Literal["parametric_dqn"] = Field(
        default="parametric_dqn",
        description="Which workflow this config is for (lets tools tell configs apart).",
    )
    action_norm_data_path: str | None = Field(
        max_length=MAX_PATH,
        default=None,
        min_length=1,
        description="Action-feature normalization JSON; null = fit it from the data and "
        "write it into model_output_path.",
    )
    max_candidates: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description="Pad possible actions to this many candidates (null = the maximum in "
        "the data).",
    )

    @model_validator(mode="after")
    def _single_output(self) -> ParametricDQNWorkflowConfig:
        last = self.training.layers[-1]
        if last not in (-1, 1):
            raise ConfigProblem(
                ("training", "layers", len(self.training.layers) - 1),
                "output size of a parametric Q-network must be -1 or 1",
                last,
            )
        if self.rainbow.dueling_architecture:
            raise ConfigProblem(
                ("rainbow", "dueling_architecture"),
                "not supported by parametric_dqn (one Q-value per candidate)",
                True,
            )
        if self.rainbow.bcq_drop_threshold is not None:
            raise ConfigProblem(
                ("rainbow", "bcq_drop_threshold"),
                "not supported by parametric_dqn (BCQ imitates a fixed set of actions)",
                self.rainbow.bcq_drop_threshold,
            )
        if self.training.cql_weighting != "constant":
            raise ConfigProblem(
                ("training", "cql_weighting"),
                "not supported by parametric_dqn (only 'constant': the behaviour estimate "
                "imitates a fixed set of actions)",
                self.training.cql_weighting,
            )
        return self

    def _path_fields(self) -> list[str]:
        return [*super()._path_fields(), "action_norm_data_path"]

    def optional_inputs(self) -> dict[str, str | None]:
        return {**super().optional_inputs(), "action_norm_data_path": self.action_norm_data_path}

    def logs_actions_as_features(self) -> bool:
        return True


# Any registered kind's config (`kinds/registry.py`): the shared code reads only what they share.
WorkflowConfig = BaseWorkflowConfig
