"""The `reagent-lite` console script: one command, a subcommand per tool.

    reagent-lite train --config x.json [--node_index=n] [--dry_run] [key.path=value ...]
    reagent-lite dqn --config x.json ...   (train, the kind named rather than read)
    reagent-lite parametric_dqn --config x.json ...
    reagent-lite predict --model DIR --data t.parquet --output scores.csv
    reagent-lite report --run DIR
    reagent-lite serve --model DIR --log-dir DIR [--exploration epsilon:0.1] [--port N]
    reagent-lite timeline --input steps.parquet --output train.parquet
    reagent-lite make-sample-data --kind gym --output-dir data/cartpole
    reagent-lite schema [--check]
    reagent-lite configs list | copy NAME DEST [--force]

`-q` / `-v` (or `--log-level LEVEL`) anywhere on the line set the log level of any command
(WARNING / DEBUG; default INFO), as `REAGENT_LITE_LOG_LEVEL` does for the Python API.

Each subcommand but `train` and `configs` is the `python -m ...` entry point of the same
tool (same flags, both spellings `--flag-name` / `--flag_name`, same exit codes: 0 ok,
2 bad config or flags, 3 bad data, 4 distributed failure, 5 training failure,
130 interrupted). Modules load only
once a subcommand is chosen, so `--help` answers without importing torch.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from reagent_lite.errors import ReagentLiteError
from reagent_lite.kinds.registry import kind_names, resolve_kind, set_launcher
from reagent_lite.version import __version__

# name → (python -m equivalent, one-line summary); a subcommand per registered kind first.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("", "train the workflow the config's `workflow` key names"),
    **{
        name: (resolve_kind(name).command.removeprefix("python -m "), resolve_kind(name).summary)
        for name in kind_names()
    },
    "predict": ("reagent_lite.predict", "score a table with an exported model"),
    "serve": ("reagent_lite.serving.server", "serve a model over HTTP, exploring and logging"),
    "report": ("reagent_lite.report", "draw a run's training and CPE curves (report.png)"),
    "timeline": ("workflows.timeline", "turn per-step logs into the training table"),
    "make-sample-data": ("workflows.make_sample_data", "log a policy into sample tables"),
    "schema": ("reagent_lite.config.schema", "write or --check the config JSON Schemas"),
    "configs": ("", "list the shipped sample configs, or copy one to edit"),
}
# The flags every command takes (the value is the level they set).
LOG_FLAGS = {"-q": "WARNING", "--quiet": "WARNING", "-v": "DEBUG", "--verbose": "DEBUG"}
ALIASES = {
    **{name.replace("_", "-"): name for name in kind_names() if "_" in name},
    "make_sample_data": "make-sample-data",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: reagent-lite <command> [-q | -v] [flags]   (reagent-lite <command> --help)",
        "",
        "Offline reinforcement learning from logged data, configured by JSON.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()),
        "",
        "-q / -v / --log-level LEVEL: log WARNING and above / DEBUG too (default INFO).",
        "Each tool is also `python -m <module>` (e.g. python -m workflows.dqn_workflow).",
    ]
    return "\n".join(lines)


def _entry(name: str) -> Callable[[list[str]], Any]:
    prog = f"reagent-lite {name}"
    if name in ("train", "configs"):
        from reagent_lite import console_commands

        command = console_commands.train if name == "train" else console_commands.configs
        return lambda argv: command(argv, prog)
    if name in kind_names():
        from reagent_lite.runner import main as run_workflow

        return lambda argv: run_workflow(name, argv, prog=prog)
    if name in ("predict", "report"):
        from reagent_lite.cli import predict_parser, report_parser

        parser = predict_parser(prog) if name == "predict" else report_parser(prog)

        def run(argv: list[str]) -> Any:
            # Flags (and --help) are handled before the tool's module loads torch.
            parser.parse_args(argv)
            return importlib.import_module(COMMANDS[name][0]).main(argv, prog=prog)

        return run
    module = importlib.import_module(COMMANDS[name][0])
    return lambda argv: module.main(argv, prog=prog)


def _take_log_level(args: list[str]) -> list[str]:
    """`args` without the log-level flags; the level they give goes to the environment, so
    that every process the command starts logs alike (`configure_logging` reads it)."""
    from reagent_lite.cli import LOG_LEVEL_ENV, parse_log_level

    rest: list[str] = []
    level: str | None = None
    it = iter(args)
    for arg in it:
        if arg == "--":  # the rest is the command's own
            rest += [arg, *it]
            break
        if arg in LOG_FLAGS:
            level = LOG_FLAGS[arg]
        elif arg in ("--log-level", "--log_level"):
            level = next(it, "")
            parse_log_level(level, arg)
        elif arg.startswith(("--log-level=", "--log_level=")):
            flag, _, level = arg.partition("=")
            parse_log_level(level, flag)
        else:
            rest.append(arg)
    if level is not None:
        os.environ[LOG_LEVEL_ENV] = level.upper()
    return rest


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    set_launcher("reagent-lite")  # messages name `reagent-lite <kind>`, not `python -m ...`
    try:
        args = _take_log_level(args)
    except ReagentLiteError as err:
        print(str(err), file=sys.stderr)
        sys.exit(err.exit_code)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        sys.exit(0 if args else 2)
    if args[0] in ("-V", "--version"):
        print(f"reagent-lite {__version__}")
        sys.exit(0)
    name = ALIASES.get(args[0], args[0])
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, [*COMMANDS, *ALIASES], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"reagent-lite: unknown command {args[0]!r}{hint}\n\n{_usage()}", file=sys.stderr)
        sys.exit(2)
    try:
        code = _entry(name)(args[1:])
    except ReagentLiteError as err:
        print(str(err), file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
