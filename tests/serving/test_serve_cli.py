"""`reagent-lite serve`'s flags: a bad one exits 2 naming it (before the model loads), and
a missing `serve` extra exits 2 with the pip command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_module


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--exploration", "epsilon:2"], "--exploration: 'epsilon:2' is not an exploration"),
        (["--max-batch", "0"], "--max-batch: expected 1 or more requests (got 0)"),
        (["--max-wait-ms", "-1"], "--max-wait-ms: expected milliseconds >= 0 (got -1.0)"),
        (["--flush-interval-s", "0"], "--flush-interval-s: expected seconds > 0 (got 0.0)"),
        (["--port", "70000"], "--port: 70000 is not a port (expected 0..65535)"),
        (["--port", "x"], "argument --port: invalid int value: 'x'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path: Path, flags: list[str], expected: str) -> None:
    result = run_module("reagent_lite.console", "serve", "--model", str(tmp_path),
                        "--log-dir", str(tmp_path / "log"), *flags, timeout=60)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_a_directory_without_a_model_exits_2(tmp_path: Path) -> None:
    result = run_module("reagent_lite.console", "serve", "--model", str(tmp_path / "none"),
                        "--log-dir", str(tmp_path / "log"), "--port", "0", timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--model: " in result.stderr and "holds no model.pt2" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_the_serve_extra_it_says_what_to_install(tmp_path: Path) -> None:
    # A fastapi that fails to import, as an absent one does.
    (tmp_path / "fastapi.py").write_text("raise ImportError('not installed')\n")
    result = run_module("reagent_lite.console", "serve", "--model", str(tmp_path),
                        "--log-dir", str(tmp_path / "log"), timeout=60,
                        env={"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}"})  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "pip install 'reagent-lite[serve]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_accepted_connections_send_without_nagle_delay() -> None:
    """Responses go out at once (TCP_NODELAY on every accepted connection): with Nagle,
    a response's body waits for the client's delayed ACK of its headers (~40 ms)."""
    import socket

    from reagent_lite.serving.server import _listen

    listener = _listen("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()[:2], timeout=10):
        conn, _ = listener.accept()
        with conn:
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert conn.proto == socket.IPPROTO_TCP  # asyncio sets NODELAY only then


def test_a_second_server_on_the_same_log_dir_exits_2(
    dqn_model: Path, serve, tmp_path: Path
) -> None:
    serve(dqn_model, log_dir=tmp_path / "log")
    result = run_module("reagent_lite.console", "serve", "--model", str(dqn_model),
                        "--log-dir", str(tmp_path / "log"), "--port", "0", timeout=180)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"decision log {tmp_path / 'log'}" in result.stderr
    assert "Traceback" not in result.stderr
