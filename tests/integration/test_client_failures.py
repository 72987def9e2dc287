"""What ``--transport client`` says when it is pointed at the wrong port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_errors import NotSubmitted, OutcomeUnknown
from dpone.ports.clickhouse_request import Credentials, Endpoint, read
from tests import chhttp


def test_the_http_port_as_native_port_is_named(
    clickhouse: ServerInfo, admin_credentials: Credentials, clickhouse_client: str
) -> None:
    """Item 24: swapped ports name the likely cause, not only "Attempt to read after eof"."""
    swapped = Endpoint("127.0.0.1", clickhouse.tcp_port, clickhouse.http_port, "default")
    transport = ClientTransport(swapped, admin_credentials, client_path=clickhouse_client)
    with pytest.raises((OutcomeUnknown, NotSubmitted)) as caught:
        transport.execute(
            read("SELECT 1", f"dpone-test-swap-{time.time_ns()}"), deadline=time.monotonic() + 60
        )
    message = caught.value.message
    assert f"127.0.0.1:{clickhouse.http_port}" in message
    assert "native port (often 9000) as --tcp-port" in message
    assert caught.value.code in ("not_native_port", "client_failed")


SLOW_CLIENT = textwrap.dedent(
    """
    import os, sys, time
    from dpone.connectors.clickhouse_client import ClientTransport
    from dpone.ports.clickhouse_request import Credentials, Endpoint, read

    http, tcp, client_path = sys.argv[1:]
    admin = Credentials(os.environ["DPONE_CLICKHOUSE_USER"], os.environ["DPONE_CLICKHOUSE_PASSWORD"])
    transport = ClientTransport(Endpoint("127.0.0.1", int(http), int(tcp), "default"), admin,
                                client_path=client_path)
    slow = read("SELECT sleepEachRow(0.5) FROM numbers(120) SETTINGS max_block_size = 1",
                f"dpone-test-sigkill-{time.time_ns()}")
    transport.execute(slow, deadline=time.monotonic() + 600)
    """
)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_sigkill_during_a_client_query_leaves_no_credential_file(
    clickhouse: ServerInfo,
    admin_credentials: Credentials,
    clickhouse_client: str,
    tmp_path: Path,
) -> None:
    """The client's configuration (user and password) never outlives dpone on disk."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(temp),
        "DPONE_CLICKHOUSE_USER": admin_credentials.user,
        "DPONE_CLICKHOUSE_PASSWORD": admin_credentials.password,
    }
    dpone = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLOW_CLIENT,
            str(clickhouse.http_port),
            str(clickhouse.tcp_port),
            clickhouse_client,
        ],
        env=env,
    )
    clients: list[int] = []
    try:
        while not clients:  # the client child runs: its configuration exists now
            assert dpone.poll() is None, "the query ended before the kill"
            clients = _children(dpone.pid)
            time.sleep(0.02)
        # The child has started; wait until it has connected (it has read its config).
        while not chhttp.rows(
            clickhouse.http_port,
            "SELECT query_id FROM system.processes WHERE query_id LIKE 'dpone-test-sigkill-%'",
        ):
            time.sleep(0.05)  # not yet connected (its configuration is read by then)
        dpone.send_signal(signal.SIGKILL)
        assert dpone.wait(timeout=60) == -signal.SIGKILL
        secret = admin_credentials.password.encode("utf-8")
        left = [p for p in temp.rglob("*") if p.is_file() and secret in p.read_bytes()]
        assert left == []
        assert list(temp.iterdir()) == []
    finally:
        if dpone.poll() is None:
            dpone.kill()
            dpone.wait()
        for pid in clients:  # the orphaned client child this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
