"""The command line shared by the workflows, and the one place errors become exit codes.

    python -m workflows.dqn_workflow --config x.json [--node_index=n] [--dry_run]
                                     [--resume] [--overwrite] [--run_id ID]
                                     [key.path=value ...]

Flag problems exit 2 (argparse's usage message); a `ReagentLiteError` prints its message
(no traceback) and exits with its `exit_code`; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reagent_lite.errors import ConfigError, ReagentLiteError


@dataclass(frozen=True)
class WorkflowArgs:
    """The parsed flags of a workflow run."""

    config: Path
    node_index: int
    dry_run: bool = False
    resume: bool = False
    run_id: str | None = None
    overwrite: bool = False
    overrides: tuple[str, ...] = ()


class _Once(argparse.Action):
    """A value flag that may be repeated only with the same value: argparse would silently
    keep the last (`--config a.json ... --config b.json` would train on b)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None and before != values:
            parser.error(
                f"{option_string}: given twice with different values (got {before}, then "
                f"{values}); give it once"
            )
        setattr(namespace, self.dest, values)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a Q-network offline from logged transitions, as the JSON config says.",
    )
    parser.add_argument(
        "--config",
        "-c",
        "--parameters",
        "-p",  # Horizon's workflows took the config as -p/--parameters
        dest="config",
        type=Path,
        action=_Once,
        required=True,
        help="workflow config (JSON); relative paths in it resolve against the working dir",
    )
    parser.add_argument(
        "--node_index",
        "--node-index",
        dest="node_index",
        type=int,
        action=_Once,
        default=None,
        help="index of this machine in [0, num_nodes) (default: $SLURM_NODEID, else 0)",
    )
    parser.add_argument(
        "--dry_run",
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="validate the config and data, print the resolved plan and exit",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from the last checkpoint in the output"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let a fresh run replace the finished model in model_output_path",
    )
    parser.add_argument(
        "--run_id",
        "--run-id",
        dest="run_id",
        action=_Once,
        default=None,
        help="name of this run, shared by all nodes (keeps a re-run apart from a crashed one)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key.path=value",
        help="set config keys, e.g. training.learning_rate=1e-4 epochs=5 (values parse as "
        "JSON when they can, else as strings; validated like the file)",
    )
    return parser


def parse_workflow_args(
    argv: Sequence[str] | None = None,
    *,
    prog: str | None = None,
    env: Mapping[str, str] | None = None,
) -> WorkflowArgs:
    """Parse workflow flags; bad flags exit 2 with argparse's usage message."""
    args = build_parser(prog).parse_args(argv)
    node_index = args.node_index
    if node_index is None:
        env = os.environ if env is None else env
        slurm = env.get("SLURM_NODEID", "").strip()
        if slurm:
            try:
                node_index = int(slurm)
            except ValueError:
                raise ConfigError(
                    f"SLURM_NODEID: expected an integer node index (got {slurm!r})"
                ) from None
        else:
            node_index = 0
    if args.run_id is not None and not args.run_id.strip():
        raise ConfigError("--run_id: must not be empty (got '')")
    return WorkflowArgs(
        config=args.config,
        node_index=node_index,
        dry_run=args.dry_run,
        resume=args.resume,
        run_id=args.run_id,
        overwrite=args.overwrite,
        overrides=tuple(args.overrides),
    )


def predict_parser(prog: str = "python -m reagent_lite.predict") -> argparse.ArgumentParser:
    """`predict`'s flags (here, so that `--help` answers without loading torch)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Score a table with the model a run exported."
    )
    parser.add_argument(
        "--model", required=True, help="model_output_path of a finished run (or its model.pt2)"
    )
    parser.add_argument(
        "--data", required=True, help="table to score (Parquet or JSON Lines, file or dir)"
    )
    parser.add_argument(
        "--output",
        required=True,
        help="file to write; its extension picks the format: .parquet, .csv or .jsonl",
    )
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=65_536)
    return parser


def report_parser(prog: str = "python -m reagent_lite.report") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Draw a run's training and CPE curves as a PNG."
    )
    parser.add_argument("--run", required=True, type=Path, help="model_output_path of a run")
    parser.add_argument(
        "--output", type=Path, default=None, help="PNG path (default: <run>/report.png)"
    )
    return parser


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


# The log level of the command line (`-q` / `-v` / `--log-level` set it, so that every
# process a command starts inherits it) and of the Python API (read once by `train`).
LOG_LEVEL_ENV = "REAGENT_LITE_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_log_level(value: str, source: str) -> int:
    """The `logging` level named `value`; `ConfigError` naming `source` otherwise."""
    name = value.strip().upper()
    if name not in LOG_LEVELS:
        raise ConfigError(
            f"{source}: unknown log level (got {value!r}); expected one of {list(LOG_LEVELS)}"
        )
    level: int = getattr(logging, name)
    return level


def log_level_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The level `REAGENT_LITE_LOG_LEVEL` names (None when unset or empty)."""
    value = (os.environ if env is None else env).get(LOG_LEVEL_ENV, "")
    return parse_log_level(value, LOG_LEVEL_ENV) if value.strip() else None


def configure_logging(level: int | None = None) -> None:
    """One format on every line (`<time> LEVEL logger: message`) on stderr, Python warnings
    included; only the command line calls this, and not when logging is already set up.
    `level` (default: `REAGENT_LITE_LOG_LEVEL`, else INFO) is reagent-lite's; other
    libraries keep INFO and above (their DEBUG output would drown `-v`'s)."""
    root = logging.getLogger()
    if not root.handlers:
        if level is None:
            level = log_level_from_env() or logging.INFO
        logging.basicConfig(
            level=max(level, logging.INFO),
            format=LOG_FORMAT,
            datefmt=LOG_DATE_FORMAT,
            stream=sys.stderr,
        )
        logging.getLogger("reagent_lite").setLevel(level)
        logging.captureWarnings(True)


def run_cli(main_fn: Callable[[], None]) -> None:
    """Run `main_fn`; turn a `ReagentLiteError` into its message and exit code."""
    try:
        main_fn()
    except ReagentLiteError as err:
        sys.stdout.flush()
        print(str(err), file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
