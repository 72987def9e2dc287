"""What ``--transport client`` says when it is pointed at the wrong port or cannot run."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_client import (
    ClientProbeDeadline,
    ClientTransport,
    ClientUnusable,
    client_version,
)
from dpone.errors import DeadlineError
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_errors import NotSubmitted, OutcomeUnknown
from dpone.ports.clickhouse_request import Credentials, Endpoint, read
from dpone.staging.composition import client_type_check
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


def script(tmp_path: Path, body: str, mode: int = 0o755) -> str:
    path = tmp_path / "clickhouse-client"
    path.write_text(body)
    path.chmod(mode)
    return str(path)


def client_at(info: ServerInfo, credentials: Credentials, path: str) -> ClientTransport:
    endpoint = Endpoint("127.0.0.1", info.http_port, info.tcp_port, "default")
    return ClientTransport(endpoint, credentials, client_path=path)


@pytest.mark.parametrize(
    ("body", "mode", "code", "number"),
    [  # a real script without execute permission; a file that is no program
        (
            "#!/bin/sh\necho 'ClickHouse client version 18.16.1.'\n",
            0o644,
            "client_not_executable",
            errno.EACCES,
        ),
        ("not a program\n", 0o755, "client_cannot_run", errno.ENOEXEC),
    ],
)
def test_a_client_that_cannot_start_is_named_and_nothing_is_sent(
    clickhouse: ServerInfo,
    admin_credentials: Credentials,
    tmp_path: Path,
    body: str,
    mode: int,
    code: str,
    number: int,
) -> None:
    path = script(tmp_path, body, mode)
    qid = f"dpone-test-unstartable-{time.time_ns()}"
    with pytest.raises(ClientUnusable) as caught:
        client_at(clickhouse, admin_credentials, path).execute(
            read("SELECT 1", qid), deadline=time.monotonic() + 60
        )
    assert isinstance(caught.value, NotSubmitted)
    assert (caught.value.code, caught.value.details["client_path"]) == (code, path)
    assert caught.value.details["query_id"] == qid and qid in caught.value.message
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == number
    assert caught.value.details["errno"] == number
    with pytest.raises(ClientUnusable) as version:
        client_version(path, deadline=time.monotonic() + 60)
    assert (version.value.code, version.value.details["client_path"]) == (code, path)
    assert isinstance(version.value.__cause__, OSError) and version.value.__cause__.errno == number


SLEEPER = "#!/bin/sh\nexec sleep 30\n"  # never answers --version in time


def test_the_version_probe_ends_at_the_callers_deadline(
    clickhouse: ServerInfo, admin_credentials: Credentials, tmp_path: Path
) -> None:
    path = script(tmp_path, SLEEPER)
    qid = f"dpone-test-slow-probe-{time.time_ns()}"
    began = time.monotonic()
    with pytest.raises(ClientProbeDeadline) as caught:
        client_at(clickhouse, admin_credentials, path).execute(
            read("SELECT 1", qid), deadline=began + 0.5
        )
    assert time.monotonic() - began < 5  # the caller's deadline, not a fixed 30 s
    error = caught.value
    assert isinstance(error, NotSubmitted) and isinstance(error, DeadlineError)
    assert error.details == {"submitted": False, "client_path": path, "query_id": qid}
    assert isinstance(error.__cause__, subprocess.TimeoutExpired)


def test_the_type_check_asks_the_version_within_its_bound(tmp_path: Path) -> None:
    path = script(tmp_path, SLEEPER)
    began = time.monotonic()
    with pytest.raises(ClientProbeDeadline) as caught:
        client_version(path, deadline=began + 0.5)
    with pytest.raises(ClientProbeDeadline):
        client_type_check(path, seconds=0.5)([("c", "Int32")])
    assert time.monotonic() - began < 5
    assert caught.value.details["client_path"] == path


def test_the_real_client_says_its_version(clickhouse_client: str) -> None:
    assert client_version(clickhouse_client, deadline=time.monotonic() + 60) == (18, 16)
