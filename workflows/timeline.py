"""Step logs → training table (docs/DATA_FORMAT.md).

    python -m workflows.timeline --input steps.parquet --output table.parquet \
        [--eval-output eval.parquet] [--eval-fraction 0.1] [--seed 0]

Without `--eval-output` every episode goes to `--output` (the eval fraction is then 0).
Bad input prints one message and exits 3 (`DataError`); bad flags exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reagent_lite.data.timeline import build_training_table, read_steps, write_table
from reagent_lite.errors import ReagentLiteError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workflows.timeline",
        description="Turn per-step logs into the transition table the workflows train on.",
    )
    parser.add_argument("--input", required=True, help="step logs: Parquet file or directory")
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
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        steps = read_steps(args.input)
        fraction = args.eval_fraction if args.eval_output else 0.0
        train, evaluation = build_training_table(
            steps, eval_fraction=fraction, seed=args.seed, source=str(args.input)
        )
        write_table(train, args.output)
        print(f"wrote {train.num_rows} transitions to {args.output}")
        if args.eval_output:
            write_table(evaluation, args.eval_output)
            print(f"wrote {evaluation.num_rows} transitions to {args.eval_output}")
    except ReagentLiteError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
