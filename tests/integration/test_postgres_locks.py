"""The dispatch gate and the table lock of a PostgreSQL store, held by real processes.

A holder is a real process that takes a lock and then stops itself (SIGSTOP), as a
publisher stalled inside its gate would; it is then killed (SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from dpone.errors import StateError
from dpone.publication.dispatch.dispatch_gate import DispatchGateBusy
from dpone.publication.dispatch.postgres_locks import (
    AdvisoryLockLost,
    PostgresDispatchGate,
    postgres_table_lock,
)

HOLD = """
import os, signal, sys
from dpone.errors import StateError
from dpone.publication.dispatch.postgres_locks import (
    AdvisoryLockLost,
    PostgresDispatchGate,
    postgres_table_lock,
)
url, kind, name = sys.argv[1:4]
lock = (PostgresDispatchGate(url).held(name) if kind == "gate"
        else postgres_table_lock(url, name, StateError))
with lock:
    print("held", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


@pytest.fixture
def stalled(postgres_store: str) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes started by :func:`hold`; killed at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def hold(url: str, kind: str, name: str, started: list[subprocess.Popen[str]]) -> int:
    """Start a process that takes the lock and stops itself; its pid once it holds it."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, url, kind, name],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    started.append(process)
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process.pid


def test_a_stalled_publisher_holds_only_its_own_gate_and_frees_it_when_killed(
    postgres_store: str, stalled: list[subprocess.Popen[str]]
) -> None:
    hold(postgres_store, "gate", "dpone_publisher_1", stalled)
    gate = PostgresDispatchGate(postgres_store, wait_seconds=1.0)
    started = time.monotonic()
    with gate.held_for_slot("db", "other_table", "dpone_publisher_2"):
        pass  # another principal, another slot: not delayed
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    with pytest.raises(DispatchGateBusy) as busy, gate.held("dpone_publisher_1"):
        pass
    assert busy.value.code == "dispatch_gate_busy"
    assert 0.9 <= time.monotonic() - started < 5.0
    stalled[0].kill()
    stalled[0].wait()
    # The server ends the dead holder's session, and with it the lock.
    deadline = time.monotonic() + 30
    while True:
        try:
            with PostgresDispatchGate(postgres_store, wait_seconds=0.5).held("dpone_publisher_1"):
                break
        except DispatchGateBusy:
            assert time.monotonic() < deadline, "the killed holder's gate was never released"


def test_a_table_held_by_another_worker_is_busy_at_once_naming_it(
    postgres_store: str, stalled: list[subprocess.Popen[str]]
) -> None:
    pid = hold(postgres_store, "table", "orders", stalled)
    started = time.monotonic()
    with (
        pytest.raises(StateError) as busy,
        postgres_table_lock(postgres_store, "orders", StateError),
    ):
        pass
    assert time.monotonic() - started < 2.0
    assert f"pid {pid}" in busy.value.message
    with postgres_table_lock(postgres_store, "customers", StateError):
        pass  # another table: free
    os.kill(pid, signal.SIGKILL)
    stalled[0].wait()
    deadline = time.monotonic() + 30
    while True:
        try:
            with postgres_table_lock(postgres_store, "orders", StateError):
                break
        except StateError:
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.1)
    with psycopg.connect(postgres_store, autocommit=True) as conn:
        held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        assert held.fetchone() == (0,)


def test_a_gate_whose_session_was_ended_under_it_says_so(postgres_store: str) -> None:
    gate = PostgresDispatchGate(postgres_store, wait_seconds=1.0)
    with (
        pytest.raises(AdvisoryLockLost) as lost,
        gate.held("dpone_publisher_3"),
        psycopg.connect(postgres_store, autocommit=True) as conn,
    ):
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE 'dpone pid % gate %'"
        )
    assert lost.value.code == "advisory_lock_lost"


def test_an_unreachable_store_is_a_typed_error_for_the_gate_and_the_lock(
    postgres_store: str,
) -> None:
    nowhere = "postgresql://dpone@127.0.0.1:1/dpone_store"
    with pytest.raises(StateError) as gate, PostgresDispatchGate(nowhere).held("u"):
        pass
    with pytest.raises(StateError) as table, postgres_table_lock(nowhere, "t", StateError):
        pass
    assert gate.value.code == table.value.code == "store_unavailable"
