"""Step logs → training table (docs/TIMELINE.md).

    python -m workflows.timeline --input steps.parquet --output train.parquet \
        [--eval-output eval.parquet] [--eval-fraction 0.1] [--seed 0] \
        [--engine duckdb|spark] [--memory-limit 1GB] [--threads N] [--temp-dir DIR] \
        [--null-propensity error|one]

Without `--eval-output` every episode goes to `--output` (the eval fraction is then 0).
Bad input prints one message and exits 3 (`DataError`); bad flags, or an engine whose
requirements are missing, exit 2; SIGTERM / Ctrl-C remove what was begun and exit 143 / 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from reagent_lite.cli import configure_logging
from reagent_lite.errors import ConfigError, ReagentLiteError
from reagent_lite.timeline import DEFAULT_MEMORY_LIMIT, DuckSettings
from reagent_lite.timeline.files import check_outputs
from reagent_lite.timeline.query import Side
from reagent_lite.timeline.stopping import Interrupted, stop_on_signals

ENGINES = ("duckdb", "spark")


def parse_args(
    argv: Sequence[str] | None = None, prog: str = "python -m workflows.timeline"
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Turn per-step logs into the transition table the workflows train on.",
    )
    parser.add_argument(
        "--input", required=True, help="step logs: Parquet or JSON Lines, a file or a directory"
    )
    parser.add_argument("--output", required=True, help="training table to write (Parquet)")
    parser.add_argument(
        "--eval-output", "--eval_output", default=None, help="eval table to write (Parquet)"
    )
    parser.add_argument(
        "--eval-fraction",
        "--eval_fraction",
        type=float,
        default=0.1,
        help="share of episodes (by hash of mdp_id) that go to --eval-output",
    )
    parser.add_argument("--seed", type=int, default=0, help="salt of the train/eval hash")
    parser.add_argument(
        "--null-propensity",
        "--null_propensity",
        choices=("error", "one"),
        default="error",
        help="a null action_probability: a bad row (error, the default), or 1.0, a "
        "deterministic logging policy as Horizon logged it, with the count logged (one)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="duckdb",
        help="duckdb (default: this machine, out of core) or spark (needs the spark extra "
        "and Java; a cluster under spark-submit, else local mode on every core)",
    )
    parser.add_argument(
        "--memory-limit",
        "--memory_limit",
        default=DEFAULT_MEMORY_LIMIT,
        help="duckdb: memory for the steps being sorted (and DuckDB's own) before they spill "
        f"to --temp-dir (default {DEFAULT_MEMORY_LIMIT})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="duckdb: threads of DuckDB and of Arrow's decoding (default: every core)",
    )
    parser.add_argument(
        "--temp-dir",
        "--temp_dir",
        default=None,
        help="duckdb: where the sort spills (default: the system's temporary directory)",
    )
    return parser.parse_args(argv)


def _outputs(args: argparse.Namespace) -> dict[Side, str]:
    if not args.eval_output:
        return {"all": args.output}
    return {"train": args.output, "eval": args.eval_output}


def run(args: argparse.Namespace) -> dict[Side, int]:
    """Check the flags and run the chosen engine; rows written per side."""
    if args.eval_output and not 0.0 <= args.eval_fraction < 1.0:
        raise ConfigError(f"--eval-fraction: {args.eval_fraction} is not in [0, 1)")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads: {args.threads}; expected at least 1")
    if args.eval_output and Path(args.eval_output).resolve() == Path(args.output).resolve():
        raise ConfigError(
            f"--eval-output: {args.eval_output} is also --output; expected two different files"
        )
    check_outputs(args.input, {"--output": args.output, "--eval-output": args.eval_output})
    outputs = _outputs(args)
    if args.engine == "spark":
        from reagent_lite.timeline import spark

        return spark.write_sides(
            args.input,
            outputs,
            eval_fraction=args.eval_fraction,
            seed=args.seed,
            null_propensity=args.null_propensity,
        )
    from reagent_lite.timeline import duck

    if args.threads is not None:  # Arrow's decoding threads too (this process is ours)
        import pyarrow

        pyarrow.set_cpu_count(args.threads)
    settings = DuckSettings(args.memory_limit, args.threads, args.temp_dir)
    return duck.write_sides(
        args.input,
        {side: Path(p) for side, p in outputs.items()},
        eval_fraction=args.eval_fraction,
        seed=args.seed,
        settings=settings,
        null_propensity=args.null_propensity,
    )


def main(argv: Sequence[str] | None = None, prog: str = "python -m workflows.timeline") -> int:
    args = parse_args(argv, prog)
    configure_logging()  # the counted warnings (null propensities, absorbing steps)
    with stop_on_signals() as received:
        try:
            written = run(args)
        except Exception as err:
            if received.signum:  # whatever the signal interrupted raised on its way out
                stopped = Interrupted(received.signum)
                print(stopped, file=sys.stderr)
                return stopped.exit_code
            if not isinstance(err, ReagentLiteError):
                raise
            print(f"error: {err}", file=sys.stderr)
            return err.exit_code
    paths = _outputs(args)
    for side, rows in written.items():
        print(f"wrote {rows} transitions to {paths[side]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
