"""The administrator's password never appears in any process's argv.

While a ``--transport client`` query runs, every process on the machine (the server
child and the ``clickhouse-client`` child included) is searched for the password.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_request import Credentials, Endpoint, read
from dpone.ports.clickhouse_result import QueryResult


def _every_cmdline() -> dict[int, bytes]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # the process ended meanwhile
    return found


def test_the_password_is_in_no_argv_while_a_client_query_runs(
    clickhouse: ServerInfo, admin_credentials: Credentials, clickhouse_client: str
) -> None:
    assert admin_credentials.password  # a generated password, never empty
    endpoint = Endpoint("127.0.0.1", clickhouse.http_port, clickhouse.tcp_port, "default")
    transport = ClientTransport(endpoint, admin_credentials, client_path=clickhouse_client)
    slow = read(
        "SELECT sleepEachRow(0.5) FROM numbers(6) SETTINGS max_block_size = 1 FORMAT JSONEachRow",
        f"dpone-test-argv-{time.time_ns()}",
    )
    result: list[QueryResult] = []
    runner = threading.Thread(
        target=lambda: result.append(transport.execute(slow, deadline=time.monotonic() + 60))
    )
    runner.start()
    clients: set[int] = set()
    secret = admin_credentials.password.encode("utf-8")
    try:
        while runner.is_alive():
            for pid, cmdline in _every_cmdline().items():
                assert secret not in cmdline, f"process {pid} carries the password in its argv"
                if b"clickhouse-client" in cmdline or b"clickhouse\x00client" in cmdline:
                    clients.add(pid)
            time.sleep(0.05)
    finally:
        runner.join()
    # The scan saw the client child itself, so the check covered it.
    assert clients, "the clickhouse-client child was never observed"
    assert len(result) == 1 and result[0].output.count(b"\n") == 6
