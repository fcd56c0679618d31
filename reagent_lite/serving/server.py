"""`reagent-lite serve`: an exported model behind HTTP, exploring and logging each decision.

    reagent-lite serve --model outputs/cartpole_dqn --log-dir logs/round1 \
        --exploration epsilon:0.1 --port 8000

Flags are checked (exit 2 naming the flag) before the model loads; the model is checked
as `predict` checks it. SIGTERM stops taking connections, answers the requests in flight,
writes the decision log out and exits 0. Once it listens, one line on stdout says where:
`serving <kind> model <model_id> on http://HOST:PORT ...` (`--port 0` picks a free port).
"""

from __future__ import annotations

import argparse
import math
import signal
import socket
import sys
from pathlib import Path

from reagent_lite.errors import ConfigError, ReagentLiteError
from reagent_lite.serving.exploration import EXPLORATION_HELP, Exploration


def serve_parser(prog: str = "python -m reagent_lite.serving.server") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Serve an exported model over HTTP.")
    p.add_argument("--model", required=True, help="model_output_path of a finished run")
    p.add_argument("--log-dir", "--log_dir", required=True, help="where decisions are logged")
    p.add_argument("--exploration", default="greedy", help=EXPLORATION_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    p.add_argument(
        "--max-batch", "--max_batch", type=int, default=64, help="most requests in one model call"
    )
    p.add_argument(
        "--max-wait-ms",
        "--max_wait_ms",
        type=float,
        default=2.0,
        help="how long a request waits for others to join its batch",
    )
    p.add_argument(
        "--flush-interval-s",
        "--flush_interval_s",
        type=float,
        default=1.0,
        help="decision log flush interval (a SIGKILL loses at most this much)",
    )
    p.add_argument(
        "--feedback-window-s",
        "--feedback_window_s",
        type=float,
        default=600.0,
        help="how long a decision waits for its feedback",
    )
    p.add_argument(
        "--reload-poll-s",
        "--reload_poll_s",
        type=float,
        default=1.0,
        help="how often to look for a new model.pt2 (0: only POST /v1/reload)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the exploration's RNG")
    return p  # fmt: skip


def check_flags(args: argparse.Namespace) -> Exploration:
    """`ConfigError` naming the first bad flag, the value and what was expected."""
    exploration = Exploration.parse(args.exploration)
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port: {args.port} is not a port (expected 0..65535)")
    if args.max_batch < 1:
        raise ConfigError(f"--max-batch: expected 1 or more requests (got {args.max_batch})")
    checks = {
        "--max-wait-ms": (args.max_wait_ms, args.max_wait_ms >= 0, "milliseconds >= 0"),
        "--flush-interval-s": (args.flush_interval_s, args.flush_interval_s > 0, "seconds > 0"),
        "--feedback-window-s": (
            args.feedback_window_s,
            args.feedback_window_s >= 0,
            "seconds >= 0",
        ),
        "--reload-poll-s": (args.reload_poll_s, args.reload_poll_s >= 0, "seconds >= 0"),
    }
    for flag, (value, ok, expected) in checks.items():
        if not (ok and math.isfinite(value)):
            raise ConfigError(f"{flag}: expected {expected} (got {value})")
    log_dir = Path(args.log_dir)
    if log_dir.exists() and not log_dir.is_dir():
        raise ConfigError(f"--log-dir: '{log_dir}' is a file (expected a directory)")
    return exploration


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say TCP, and
        # without it Nagle holds a response's body behind its headers for the client's
        # delayed ACK (a flat 40 ms per request on Linux loopback).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        raise ConfigError(
            f"--host/--port: cannot listen on {host}:{port} ({err.strerror or err})"
        ) from err
    sock.set_inheritable(True)
    return sock


def serve(argv: list[str], prog: str) -> None:
    args = serve_parser(prog).parse_args(argv)  # bad flags exit 2 before anything loads
    exploration = check_flags(args)
    from reagent_lite.extras import require

    for module in ("fastapi", "uvicorn"):
        require(module, "serve", "reagent-lite serve", "the Python API's Policy needs neither")
    import uvicorn

    from reagent_lite.cli import configure_logging
    from reagent_lite.serving.app import create_app
    from reagent_lite.serving.policy import Policy

    configure_logging()
    sock = _listen(args.host, args.port)  # a taken port fails before the model loads
    policy = Policy(
        args.model,
        exploration,
        log_dir=args.log_dir,
        seed=args.seed,
        flush_interval_s=args.flush_interval_s,
        feedback_window_s=args.feedback_window_s,
    )
    host, port = sock.getsockname()[:2]

    def ready() -> None:
        model = policy.model
        print(
            f"serving {model.kind} model {model.model_id} on http://{host}:{port}"
            f" (exploration {exploration}, decisions logged to {args.log_dir})",
            flush=True,
        )

    app = create_app(
        policy,
        max_batch=args.max_batch,
        max_wait_s=args.max_wait_ms / 1000.0,
        reload_poll_s=args.reload_poll_s,
        on_ready=ready,
    )
    config = uvicorn.Config(
        app, log_config=None, access_log=False, timeout_graceful_shutdown=60, lifespan="on"
    )
    # uvicorn drains on SIGTERM, then raises the signal again under the handler it found:
    # this one, so that a drained server exits 0 rather than dying of the signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        policy.close()  # (idempotent) also when start-up failed after the log opened
        sock.close()


def main(
    argv: list[str] | None = None, prog: str = "python -m reagent_lite.serving.server"
) -> None:
    try:
        serve(list(sys.argv[1:] if argv is None else argv), prog)
    except ReagentLiteError as err:
        print(str(err), file=sys.stderr)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
