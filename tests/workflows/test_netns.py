"""Two nodes as real hosts: each in its own network namespace, joined by a veth pair.

Node 0 lives in one namespace with 10.200.61.1/24, node 1 in another with 10.200.61.2/24;
the only link between them is the veth pair, and gloo is bound to it with
``GLOO_SOCKET_IFNAME``. The filesystem (rendezvous directory, data, outputs) is shared, as
NFS would be. The namespaces are private to this test and removed in a `finally`; nothing
is sent anywhere else. Skips where namespaces cannot be made (not root, no `ip`, no
permission, no veth support).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workflows.nodes import Job, assert_outputs_once, make_parametric_rows, write_config

SUBNET = "10.200.61"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def two_hosts() -> Iterator[list[tuple[str, str, str]]]:
    """[(namespace, interface, address)] for node 0 and node 1."""
    if not sys.platform.startswith("linux"):
        pytest.skip("network namespaces need Linux")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (apt-get install -y iproute2)")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    tag = f"rl{os.getpid() % 100000}"
    hosts = [(f"{tag}ns{k}", f"{tag}v{k}", f"{SUBNET}.{k + 1}") for k in (0, 1)]
    made: list[str] = []
    try:
        for ns, _, _ in hosts:
            result = _ip("netns", "add", ns, check=False)
            if result.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {result.stderr.strip()}")
            made.append(ns)
        (_, if0, _), (_, if1, _) = hosts
        result = _ip("link", "add", if0, "type", "veth", "peer", "name", if1, check=False)
        if result.returncode != 0:
            pytest.skip(f"cannot create a veth pair: {result.stderr.strip()}")
        for ns, ifname, addr in hosts:
            _ip("link", "set", ifname, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        probe = _ip("netns", "exec", hosts[0][0], "true", check=False)
        if probe.returncode != 0:
            pytest.skip(f"cannot run a process in a network namespace: {probe.stderr.strip()}")
        yield hosts
    finally:
        for ns in made:
            _ip("netns", "del", ns, check=False)  # takes its end of the veth pair with it
        _ip("link", "del", hosts[0][1], check=False)  # in case it never moved


def _tx_bytes(ns: str, ifname: str) -> int:
    path = f"/sys/class/net/{ifname}/statistics/tx_bytes"
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", path],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(out.stdout.strip())


def test_two_nodes_in_separate_network_namespaces(
    tmp_path: Path, two_hosts: list[tuple[str, str, str]]
) -> None:
    data = make_parametric_rows(tmp_path / "data", rows=300)
    shared = tmp_path / "nfs"
    cfg = write_config(
        shared / "c.json",
        "parametric_dqn",
        data,
        shared / "out",
        num_nodes=2,
        init_method=(shared / "rdzv").as_uri(),
        collective_timeout_s=60,
    )
    job = Job("parametric_dqn", cfg, tmp_path / "logs", env={"REAGENT_LITE_VERIFY_REPLICAS": "1"})
    try:
        nodes = [
            job.start(
                k,
                prefix=["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={ifname}"],
            )
            for k, (ns, ifname, _) in enumerate(two_hosts)
        ]
        for node in nodes:
            assert node.wait() == 0, node.text()[-4000:]
    finally:
        job.close()
    assert "replica check: all 2 ranks held identical parameters" in nodes[0].text()
    assert_outputs_once(shared / "out")
    assert "model: " not in nodes[1].text()
    # The collectives crossed the veth pair (a few KB of handshakes would be far less).
    sent = [_tx_bytes(ns, ifname) for ns, ifname, _ in two_hosts]
    assert min(sent) > 50_000, f"bytes sent over the veth pair: {sent}"
