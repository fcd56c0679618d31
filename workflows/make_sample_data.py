"""Generate a sample data set: step logs, training table and eval table.

    python -m workflows.make_sample_data --kind gym --env CartPole-v1 --episodes 5000 \
        --policy random --output-dir data/cartpole [--parametric] [--seed 0] [--eval-fraction 0.1]
    python -m workflows.make_sample_data --kind synthetic_parametric --states 20000 \
        --output-dir data/synthetic [--episode-length 1]

Writes steps.parquet, train.parquet, eval.parquet (and values.json for synthetic data) in
--output-dir and prints a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from reagent_lite.errors import ReagentLiteError
from reagent_lite.extras import require
from reagent_lite.samples.generate import DEFAULTS, KINDS, generate_sample_data
from reagent_lite.samples.gym_logging import POLICIES


def parse_args(
    argv: Sequence[str] | None = None, prog: str = "python -m workflows.make_sample_data"
) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Log a policy in an environment and build train/eval tables from it.",
    )
    p.add_argument("--kind", choices=KINDS, default=DEFAULTS["kind"])
    p.add_argument("--env", default=DEFAULTS["env"], help="gymnasium env id (kind=gym)")
    p.add_argument("--episodes", type=int, default=DEFAULTS["episodes"])
    p.add_argument(
        "--states", type=int, default=None, help="synthetic: episodes (default --episodes)"
    )
    p.add_argument("--policy", choices=POLICIES, default=DEFAULTS["policy"])
    p.add_argument("--epsilon", type=float, default=DEFAULTS["epsilon"])
    p.add_argument(
        "--random-episode-fraction",
        "--random_episode_fraction",
        type=float,
        default=DEFAULTS["random_episode_fraction"],
        help="gym: fraction of the episodes played uniformly at random instead of by --policy",
    )
    p.add_argument(
        "--parametric",
        action="store_true",
        help="gym: log actions as one-hot feature maps (for parametric_dqn)",
    )
    p.add_argument("--episode-length", "--episode_length", type=int, default=1)
    p.add_argument("--min-candidates", "--min_candidates", type=int, default=4)
    p.add_argument("--max-candidates", "--max_candidates", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-fraction", "--eval_fraction", type=float, default=0.1)
    p.add_argument("--output-dir", "--output_dir", required=True)
    return p.parse_args(argv)


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m workflows.make_sample_data"
) -> int:
    args = parse_args(argv, prog)
    try:
        if args.kind == "gym":
            require(
                "gymnasium",
                "--kind gym",
                f"logging env {args.env}",
                "or --kind synthetic_parametric",
            )
        result = generate_sample_data(
            kind=args.kind,
            env=args.env,
            episodes=args.episodes,
            policy=args.policy,
            epsilon=args.epsilon,
            random_episode_fraction=args.random_episode_fraction,
            seed=args.seed,
            eval_fraction=args.eval_fraction,
            parametric=args.parametric,
            states=args.states,
            episode_length=args.episode_length,
            min_candidates=args.min_candidates,
            max_candidates=args.max_candidates,
            output_dir=args.output_dir,
        )
    except ReagentLiteError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    summary = {k: v for k, v in result.summary.items() if k != "env" or args.kind == "gym"}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
