"""A third kind from this one module: a one-step contextual bandit, registered with one
`register_kind` call and run end to end on the CPU through `reagent_lite.train`.

State features → choose one of N named actions → reward; no next state, no episodes
(γ plays no part: every row is terminal). Nothing here edits a product file: the config
model, the `Kind` (schema, layout, feature space, networks, export, serving), the
trainer's maths and the shard builder are all declared below, and the product finds them
through the registry alone: `reagent_lite.train` trains it, `load_model` scores with it and
`reagent_lite.Policy` serves it, logging its decisions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pydantic import Field as ConfigField
from torch import Tensor, nn

import reagent_lite
from reagent_lite.api import RunResult
from reagent_lite.config import BaseWorkflowConfig, DQNWorkflowConfig, load_config
from reagent_lite.config.loader import config_class
from reagent_lite.data.arrow import column_of, is_str, to_float32
from reagent_lite.data.checks import nonfinite_rows, propensity_rows
from reagent_lite.data.ingest import Layout
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.rows import Rows
from reagent_lite.data.scatter import action_index
from reagent_lite.data.schema import STATE_COLUMNS, TableSchema, features, field
from reagent_lite.data.scoring import STATE as STATE_FIELD
from reagent_lite.data.scoring import run_batched
from reagent_lite.data.shard_builder import IngestedShard, ShardBuilder
from reagent_lite.data.validate import ValidationReport
from reagent_lite.data.windows import scan_units
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError, DataError
from reagent_lite.kinds import KindSpec, register_kind, registered
from reagent_lite.kinds.base import Actor, DiscreteSpace, Kind, agree_ids
from reagent_lite.kinds.discrete import DiscreteServingModule, NamedActing
from reagent_lite.kinds.serving import Acting
from reagent_lite.models import build_q_network
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.runner import main as run_workflow
from reagent_lite.serving.decision_log import DecisionLog
from reagent_lite.serving.policy import RequestError
from reagent_lite.trainers.common import DQNHyperParams, QLearningTrainer, QLogged

ACTIONS = ["left", "middle", "right"]

# ----------------------------------------------------------------------------- config


class BanditConfig(BaseWorkflowConfig):
    """A contextual bandit: one decision per row, rewarded at once."""

    workflow: Literal["bandit"] = ConfigField(default="bandit", description="This kind.")
    arms: list[str] = ConfigField(min_length=2, description="Action names, as logged.")


# ----------------------------------------------------------------------------- data

BANDIT_SCHEMA = TableSchema(
    "bandit",
    (
        features(*STATE_COLUMNS),
        field("action", is_str, "action names (strings)"),
        field("reward", pa.types.is_floating, "numbers", nonfinite_rows("NaN reward")),
        field("action_probability", pa.types.is_floating, "numbers in (0, 1]", propensity_rows),
    ),
)
FIELDS = ("action", "reward", "terminal", "time_diff", "propensity", "possible_actions_mask")


class BanditShard(IngestedShard):
    pass


class BanditShardBuilder(ShardBuilder[BanditShard]):
    """State matrix, action index and reward; no next state, no episode columns."""

    def __init__(self, arms: list[str], capacity: int | None, source: str, ids: list[str]):
        super().__init__(
            capacity=capacity,
            use_seq_num_diff_as_time_diff=False,
            source=source,
            feature_ids=ids,
        )
        del self.arrays["next_state"]
        self.arms = arms
        self.alloc("action", (), np.int64)

    def add(self, table: pa.Table) -> None:
        lo, hi = self.n, self.n + table.num_rows
        state = column_of(table, STATE_COLUMNS, self.source)
        self.discover(state, self.columns, self.state_ids)
        self.ensure(hi)
        self.scatter(state, self.arrays["state"][lo:hi], self.columns)
        action = action_index(table.column("action"), self.arms)
        if (action < 0).any():
            raise DataError(f"{self.source}: column 'action': names outside {self.arms}")
        self.arrays["action"][lo:hi] = action
        self.arrays["reward"][lo:hi] = to_float32(table.column("reward"))
        self.arrays["propensity"][lo:hi] = to_float32(table.column("action_probability"))
        self.n = hi

    def finish(self, report: ValidationReport) -> BanditShard:
        n = self.n
        fields = self.rows(("action", "reward", "propensity"))
        fields |= {
            "terminal": np.ones(n, np.float32),  # one step: nothing follows
            "time_diff": np.ones(n, np.float32),
            "possible_actions_mask": np.ones((n, len(self.arms)), np.float32),
            "mdp_id": np.arange(n, dtype=np.int64),
            "sequence_number": np.zeros(n, np.int64),
        }
        return BanditShard(
            report,
            columns=self.columns,
            state_ids=self.state_ids,
            features=self.rows(("state",)),
            fields=fields,
        )


# ----------------------------------------------------------------------------- maths


class BanditBatch(Protocol):
    """What `BanditTrainer` reads (and the shared trainer code: terminal, time_diff...)."""

    @property
    def state(self) -> Tensor: ...
    @property
    def action(self) -> Tensor: ...
    @property
    def reward(self) -> Tensor: ...
    @property
    def terminal(self) -> Tensor: ...
    @property
    def time_diff(self) -> Tensor: ...
    @property
    def possible_actions_mask(self) -> Tensor: ...


class BanditTrainer(QLearningTrainer[BanditBatch]):
    """Q(s, a) regressed on the immediate reward: the target's next value is 0."""

    def _q_logged(self, batch: BanditBatch, net: nn.Module) -> QLogged:
        q_all = net(batch.state)
        return q_all.gather(1, batch.action.unsqueeze(1)).squeeze(1), q_all, None

    def _next_value(self, batch: BanditBatch) -> Tensor:
        value: Tensor = torch.zeros_like(batch.reward)
        return value


# ----------------------------------------------------------------------------- kind


class BanditKind(Kind[BanditConfig, DiscreteSpace]):
    name = "bandit"
    space_type = DiscreteSpace
    batch_type = BanditBatch
    scoring_fields = (STATE_FIELD,)
    signature: ClassVar[dict[str, Any]] = {
        "inputs": ["state_values [B,F]", "state_presence [B,F]"],
        "output": "expected reward [B,A] in the order of 'actions'",
    }
    log_action: ClassVar[pa.DataType | None] = pa.string()  # decisions log the arm's name

    def schema(self, cfg: BanditConfig) -> TableSchema:
        return BANDIT_SCHEMA

    def layout(self, cfg: BanditConfig, space: DiscreteSpace | None = None) -> Layout[BanditShard]:
        ids = space.state_ids if space is not None else []

        def conform(shard: BanditShard) -> None:
            from reagent_lite.data.shard_builder import FeatureColumns, reorder_columns

            shard.features = {
                k: reorder_columns(v, shard.columns, ids) for k, v in shard.features.items()
            }
            shard.columns = FeatureColumns(ids)

        return Layout(
            BANDIT_SCHEMA,
            lambda capacity, source: BanditShardBuilder(list(cfg.arms), capacity, source, ids),
            conform if space is not None else None,
        )

    def agree_space(
        self, ctx: DistContext, cfg: BanditConfig, shard: IngestedShard
    ) -> DiscreteSpace:
        return DiscreteSpace(state_ids=agree_ids(ctx, shard.state_ids), actions=list(cfg.arms))

    def scan_space(
        self, ctx: DistContext, cfg: BanditConfig, units: list[ShardPiece]
    ) -> DiscreteSpace:
        ids = scan_units(units, {"state": STATE_COLUMNS})[0]["state"]
        return DiscreteSpace(state_ids=agree_ids(ctx, ids), actions=list(cfg.arms))

    def training_tensors(self, shard: IngestedShard, pre: dict[str, Preprocessor]) -> Rows:
        state = pre["state"].normalize_rows(torch.from_numpy(shard.features.pop("state")))
        fields = {k: torch.from_numpy(shard.fields[k]) for k in (*FIELDS, "mdp_id")}
        return Rows({"state": state, **fields})

    def build_q_network(
        self, cfg: BanditConfig, dims: dict[str, int], space: DiscreteSpace
    ) -> nn.Module:
        t = cfg.training
        return build_q_network(
            in_dim=dims["state"],
            n_actions=len(space.actions),
            layers=list(t.layers),
            activations=list(t.activations),
        )

    def build_trainer(
        self, q_net: nn.Module, cfg: BanditConfig, space: DiscreteSpace, unwrapped: nn.Module
    ) -> BanditTrainer:
        return BanditTrainer(q_net, DQNHyperParams.from_config(cfg), unwrapped=unwrapped)

    def q_all(self, net: nn.Module, batch: Any, *, next_state: bool) -> Tensor:
        out: Tensor = net(batch.state)
        return out

    def candidate_mask(self, batch: Any, *, next_state: bool) -> Tensor:
        mask: Tensor = batch.possible_actions_mask
        return mask

    def logged_index(self, batch: Any) -> Tensor:
        index: Tensor = batch.action
        return index

    def serving_module(self, pre: dict[str, Preprocessor], q_net: nn.Module) -> nn.Module:
        return DiscreteServingModule(pre["state"], q_net)

    def example_inputs(self, space: DiscreteSpace, batch: int = 3) -> tuple[Tensor, ...]:
        n = len(space.state_ids)
        return (torch.randn(batch, n, generator=torch.Generator().manual_seed(0)),
                torch.ones(batch, n))  # fmt: skip

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        batch = torch.export.Dim("batch", min=1, max=1 << 30)
        return {"state_values": {0: batch}, "state_presence": {0: batch}}

    def score_rows(
        self,
        program: Any,
        table: pa.Table,
        state: tuple[Tensor, Tensor],
        space: DiscreteSpace,
        batch_size: int,
        source: str,
    ) -> pa.Table:
        q = torch.cat(run_batched(program, state, batch_size)).numpy()
        best = np.asarray(space.actions, dtype=object)[q.argmax(axis=1)]
        return table.append_column(
            "expected_rewards", pa.array(list(q), type=pa.list_(pa.float32()))
        ).append_column("best_action", pa.array(best.tolist(), type=pa.string()))

    def greedy_actor(self, program: Any, space: DiscreteSpace, n_env_actions: int) -> Actor:
        return lambda state, presence: program(state, presence).argmax(dim=1).tolist()

    def acting(self, space: DiscreteSpace) -> Acting:
        # Served as a dqn model is: one expected reward per named arm.
        return NamedActing(self.name, space.actions)


class ScoredOnlyBanditKind(BanditKind):
    """The bandit without its serving part: its models are scored, not served."""

    log_action = None

    def acting(self, space: DiscreteSpace) -> Acting:
        return Kind.acting(self, space)


# ----------------------------------------------------------------------------- the test

SPEC = KindSpec(
    name="bandit",
    config=BanditConfig,
    kind=BanditKind,
    command="reagent_lite.train (tests/kinds/test_third_kind.py)",
    summary="a one-step contextual bandit",
    markers=frozenset({"arms"}),
)


@pytest.fixture
def bandit() -> Iterator[KindSpec]:
    # Registered for this test only: the other tests see the shipped kinds alone.
    with registered(SPEC) as spec:
        yield spec


def best_arm(x: np.ndarray) -> np.ndarray:
    """The arm a context rewards: left when x0 < -0.5, right when x0 > 0.5, else middle."""
    return np.where(x[:, 0] < -0.5, 0, np.where(x[:, 0] > 0.5, 2, 1))


def bandit_table(rows: int, seed: int) -> tuple[pa.Table, np.ndarray]:
    """Contexts (two features, one irrelevant), a uniformly random logged arm, and reward
    1 (plus noise) where the arm is the context's best."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 1.5, size=(rows, 2)).astype(np.float32)
    arm = rng.integers(0, len(ACTIONS), rows)
    reward = (arm == best_arm(x)).astype(np.float64) + rng.normal(0, 0.1, rows)
    state = pa.array(
        [list(zip(["0", "1"], map(float, r), strict=True)) for r in x],
        type=pa.map_(pa.string(), pa.float32()),
    )
    table = pa.table(
        {
            "state_features": state,
            "action": pa.array([ACTIONS[i] for i in arm]),
            "reward": pa.array(reward),
            "action_probability": pa.array(np.full(rows, 1 / len(ACTIONS))),
        }
    )
    return table, best_arm(x)


def bandit_config(tmp_path: Any) -> dict[str, Any]:
    return {
        "workflow": "bandit",
        "arms": ACTIONS,
        "training_data_path": str(tmp_path / "train.parquet"),
        "model_output_path": str(tmp_path / "model"),
        "epochs": 6,
        "rl": {"gamma": 0.0},
        "training": {
            "layers": [-1, 32, -1],
            "activations": ["relu", "linear"],
            "minibatch_size": 128,
            "learning_rate": 0.01,
        },
        "evaluation": {"calc_cpe_in_training": False},
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """One bandit run for the module's tests (registered while it trains)."""
    tmp = tmp_path_factory.mktemp("bandit")
    train, _ = bandit_table(4000, seed=0)
    pq.write_table(train, tmp / "train.parquet", row_group_size=1000)
    with registered(SPEC):
        return reagent_lite.train(bandit_config(tmp))


def test_a_registered_third_kind_trains_exports_and_scores(
    bandit: KindSpec, trained: RunResult
) -> None:
    assert trained.workflow == "bandit"
    assert trained.selected_epoch is not None and len(trained.epoch_metrics) == 6
    model = reagent_lite.load_model(trained.model_dir)
    assert model.workflow == "bandit" and model.meta["workflow"] == "bandit"
    fresh, best = bandit_table(500, seed=1)
    scored = model.score(fresh)
    chosen = np.array([ACTIONS.index(a) for a in scored.column("best_action").to_pylist()])
    # The learnt policy picks the rewarded arm (uniform guessing: a third).
    assert (chosen == best).mean() > 0.9
    rewards = np.stack(scored.column("expected_rewards").to_numpy(zero_copy_only=False))
    assert rewards.shape == (500, 3)
    assert np.abs(rewards.max(axis=1) - 1.0).mean() < 0.25  # the best arm's reward is ~1


def test_a_registered_third_kind_is_served_and_its_decisions_logged(
    bandit: KindSpec, trained: RunResult, tmp_path: Path
) -> None:
    contexts = {"left": -1.2, "middle": 0.0, "right": 1.2}  # x0 of each arm's context
    with reagent_lite.Policy(trained.model_dir, log_dir=tmp_path / "log", seed=0) as policy:
        assert policy.model.describe()["actions"] == ACTIONS
        for arm, x0 in contexts.items():
            decision = policy.act({"0": x0, "1": 0.3}, mdp_id=arm)
            assert decision.action == arm and decision.propensity == 1.0  # greedy
            assert policy.feedback(decision.decision_id, reward=1.0)
        # Offered two arms, it picks the better of them (by name), as a dqn policy does.
        assert policy.act({"0": 0.0}, possible_actions=["right", "middle"]).action == "middle"
        with pytest.raises(RequestError, match=r"possible_actions\[0\]: unknown action 'up'"):
            policy.act({"0": 0.0}, possible_actions=["up"])
    rows = sorted(pq.read_table(tmp_path / "log").to_pylist(), key=lambda r: r["sequence_number"])
    logged = {r["mdp_id"]: r for r in rows if not r["feedback_missing"]}
    assert {m: (r["action"], r["reward"]) for m, r in logged.items()} == {
        arm: (arm, 1.0) for arm in contexts
    }
    assert logged["left"]["possible_actions"] == ACTIONS


def test_a_kind_without_a_serving_part_is_refused_by_serving_by_name(
    trained: RunResult, tmp_path: Path
) -> None:
    with registered(dataclasses.replace(SPEC, kind=ScoredOnlyBanditKind)):
        assert reagent_lite.load_model(trained.model_dir).workflow == "bandit"  # still scored
        with pytest.raises(ConfigError, match=r"holds a bandit model; serving takes dqn or "
                           r"parametric_dqn models"):  # fmt: skip
            reagent_lite.Policy(trained.model_dir)
        with pytest.raises(ValueError, match="kind is 'bandit'; expected one of dqn, parametric"):
            DecisionLog(tmp_path, "bandit")


def test_the_registry_finds_the_kind_of_a_config_by_its_keys(bandit: KindSpec) -> None:
    assert config_class("bandit") is BanditConfig
    cfg = reagent_lite.load_config({"arms": ["a", "b"], "training_data_path": "t",
                                    "model_output_path": "m"})  # fmt: skip
    assert isinstance(cfg, BanditConfig)


def test_an_unregistered_kind_is_a_config_error_naming_the_registered_ones(
    tmp_path: Any,
) -> None:
    with pytest.raises(ConfigError, match=r"workflow: unknown kind \(got 'bandit'\); expected"):
        reagent_lite.train({**bandit_config(tmp_path), "workflow": "bandit"}, overrides=None)


def test_a_name_registers_once_and_its_config_says_its_name(bandit: KindSpec) -> None:
    with pytest.raises(ValueError, match="registered already"), registered(SPEC):
        pass
    with pytest.raises(ValueError, match="needs a `workflow` field defaulting to 'slate'"):
        register_kind(dataclasses.replace(SPEC, name="slate"))


def test_the_runner_dry_runs_a_registered_kind(
    bandit: KindSpec, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pq.write_table(bandit_table(50, seed=2)[0], tmp_path / "train.parquet")
    path = tmp_path / "bandit.json"
    path.write_text(json.dumps(bandit_config(tmp_path)))
    run_workflow("bandit", ["--config", str(path), "--dry_run"])
    out = capsys.readouterr().out
    assert "workflow: bandit" in out
    assert "train.parquet: first 50 rows pass the training checks" in out
    assert "state features (identified from 50 sample rows):" in out


def test_a_config_of_a_registered_kind_given_to_another_kind_says_so(
    bandit: KindSpec, tmp_path: Any
) -> None:
    path = tmp_path / "bandit.json"
    path.write_text(json.dumps(bandit_config(tmp_path)))
    with pytest.raises(ConfigError, match="workflow: this is a bandit config") as err:
        load_config(path, DQNWorkflowConfig)
    assert "run it with reagent_lite.train" in str(err.value)
