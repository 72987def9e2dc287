"""Transport faults on the real server: evidence, names, sessions, caps and the query log."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_client import ClientTransport
from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.remote_termination import (
    QueryOrigin,
    Termination,
    query_log_events,
    query_log_state,
)
from dpone.errors import ConfigurationError
from dpone.localserver import ADMIN_USER, ServerInfo
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint, read
from tests import chhttp
from tests.plugins.managed_server import READER_PASSWORD, TEST_DATABASE
from tests.plugins.transports import DB, fake_client, make_transport, soon


@pytest.fixture
def kind(transport_kind: str, clickhouse: ServerInfo) -> str:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    return transport_kind


# --- control output (item 11)


def test_control_rows_keep_u0085_from_the_server(kind: str, clickhouse: ServerInfo) -> None:
    t = make_transport(kind, clickhouse)
    sql = "SELECT concat('a', char(0xC2, 0x85), 'b') AS s, 7 AS n FORMAT JSONEachRow"
    rows = t.execute(read(sql, f"r-{kind}-nel"), deadline=soon()).json_rows()
    assert rows == [{"s": "a\u0085b", "n": 7}]


def test_non_utf8_control_output_is_a_coded_failure(kind: str, clickhouse: ServerInfo) -> None:
    t = make_transport(kind, clickhouse)
    result = t.execute(
        read("SELECT unhex('61ff') AS s FORMAT JSONEachRow", f"r-{kind}-ff"), deadline=soon()
    )
    with pytest.raises(OutcomeUnknown) as caught:
        result.json_rows()
    assert caught.value.code == "invalid_control_output"
    assert caught.value.details["line"] == 1 and caught.value.details["byte_offset"] == 7


# --- names for what is wrong (items 13, 24)


def test_swapped_ports_are_named(clickhouse: ServerInfo) -> None:
    swapped = Endpoint("127.0.0.1", clickhouse.tcp_port, clickhouse.http_port, DB)
    # The native port answers and closes at once; on a loaded machine the close can
    # reset the connection before its answer is read, which is an unknown outcome.
    # The answer is named whenever it arrives; a few tries make it arrive.
    named = None
    for attempt in range(5):
        try:
            HttpTransport(swapped, Credentials("default")).execute(
                read("SELECT 1", f"r-swapped-{attempt}"), deadline=soon()
            )
        except NotSubmitted as exc:
            named = exc
            break
        except OutcomeUnknown:
            continue
    assert named is not None, "the native port's answer was never read in 5 tries"
    assert named.code == "native_port"
    assert f"127.0.0.1:{clickhouse.tcp_port}" in str(named)
    assert "native (TCP) port" in str(named)


def test_an_unknown_host_is_named_and_not_submitted(kind: str, clickhouse: ServerInfo) -> None:
    endpoint = Endpoint("no-such-host.invalid", clickhouse.http_port, clickhouse.tcp_port, DB)

    def attempt() -> None:
        if kind == "http":
            HttpTransport(endpoint, Credentials("default"))
        else:
            ClientTransport(endpoint, Credentials("default")).execute(
                read("SELECT 1", "r-client-dns"), deadline=soon()
            )

    with pytest.raises(NotSubmitted) as caught:
        attempt()
    assert caught.value.code == "host_not_found"
    assert "'no-such-host.invalid'" in str(caught.value)


def test_a_utf8_user_name_reaches_the_server(kind: str, clickhouse: ServerInfo) -> None:
    # The managed server declares only ASCII users; the server's refusal names the
    # user it decoded, which proves the name travelled as UTF-8.
    t = make_transport(kind, clickhouse, user="Łukasz-пользователь", password="x")
    with pytest.raises(ClickHouseServerError) as caught:
        t.execute(read("SELECT 1", f"r-{kind}-utf8-user"), deadline=soon())
    assert caught.value.details["clickhouse_code"] == 516
    assert "Łukasz-пользователь" in str(caught.value)


# --- HTTP sessions (publication addition b)


def session_read(sql: str, qid: str, session: str, **more: object) -> ClickHouseRequest:
    return dataclasses.replace(read(sql, qid), session_id=session, **more)  # type: ignore[arg-type]


def test_an_expired_session_answers_372(clickhouse: ServerInfo) -> None:
    t = make_transport("http", clickhouse)
    session = f"gate-{time.time_ns()}"
    t.execute(session_read("SELECT 1", "r-sess-open", session, session_timeout=1), deadline=soon())
    # It exists: a checked request inside the timeout succeeds (and restarts the timeout).
    t.execute(
        session_read("SELECT 1", "r-sess-alive", session, session_timeout=1, session_check=True),
        deadline=soon(),
    )
    time.sleep(3.5)  # the timeout is the behaviour under test: 1 s plus the close cycle
    with pytest.raises(ClickHouseServerError) as caught:
        t.execute(
            session_read("SELECT 1", "r-sess-gone", session, session_check=True), deadline=soon()
        )
    assert caught.value.details["clickhouse_code"] == 372


def test_a_busy_session_answers_373(clickhouse: ServerInfo) -> None:
    t = make_transport("http", clickhouse)
    session = f"busy-{time.time_ns()}"
    slow = session_read(
        "SELECT sleepEachRow(0.5) FROM numbers(30) SETTINGS max_block_size = 1 FORMAT TabSeparated",
        "r-sess-slow",
        session,
        session_timeout=30,
    )
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            t.execute(slow, deadline=soon(60))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        deadline = soon(20)
        while not chhttp.rows(
            clickhouse.http_port,
            "SELECT 1 AS x FROM system.processes WHERE query_id = 'r-sess-slow'",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(ClickHouseServerError) as caught:
            t.execute(session_read("SELECT 1", "r-sess-second", session), deadline=soon())
        assert caught.value.details["clickhouse_code"] == 373
    finally:
        chhttp.query(clickhouse.http_port, "KILL QUERY WHERE query_id = 'r-sess-slow' SYNC")
        worker.join(30)
    assert len(outcome) == 1  # the killed query did not succeed


def test_the_client_refuses_a_session_before_starting(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    path = fake_client(tmp_path, f"touch {ran}")
    t = make_transport("client", clickhouse, client_path=path)
    with pytest.raises(ConfigurationError) as caught:
        t.execute(session_read("SELECT 1", "r-client-session", "s-1"), deadline=soon())
    assert caught.value.code == "session_unsupported"
    assert not ran.exists()


# --- the query log (item 14, publication addition a)


def test_a_reused_query_id_logs_every_run(clickhouse: ServerInfo) -> None:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    t = make_transport("http", clickhouse)
    qid = f"r-reused-{time.time_ns()}"
    t.execute(read("SELECT 1", qid), deadline=soon())
    # The server may list the first run for a moment after its answer: a second run
    # with its id is refused then (216 QUERY_WITH_SAME_ID_IS_ALREADY_RUNNING; seen in
    # CI), and runs once the first is gone.
    for _ in range(100):
        try:
            t.execute(read("SELECT 1", qid), deadline=soon())
            break
        except ClickHouseServerError as exc:
            if exc.details.get("clickhouse_code") != 216:
                raise
            time.sleep(0.05)
    else:
        raise AssertionError(f"{qid} was still running 5 s after it answered")
    seen = query_log_events(t, qid, probe_id=f"{qid}-log", deadline=soon())
    assert seen.observable
    assert [e.type for e in seen.events] == ["QueryStart", "QueryFinish"] * 2
    assert {(e.user, e.current_database, e.query_kind) for e in seen.events} == {
        (ADMIN_USER, DB, "Select")
    }
    starts = [e.query_start_time_us for e in seen.events]
    assert starts[0] == starts[1] < starts[2] == starts[3]
    assert all(e.exception_code == 0 for e in seen.events)


def test_the_query_log_proof_is_bound_to_its_origin(clickhouse: ServerInfo) -> None:
    chhttp.query(
        clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {TEST_DATABASE} ENGINE = Atomic"
    )
    qid = f"r-origin-{time.time_ns()}"
    admin = make_transport("http", clickhouse)
    before = time.time()
    admin.execute(read("SELECT 1", qid), deadline=soon())
    after = time.time()
    # Another user runs a failing query under the same (user-chosen) id.
    other = make_transport(
        "http", clickhouse, user="reader", password=READER_PASSWORD, database=TEST_DATABASE
    )
    with pytest.raises(ClickHouseServerError):
        other.execute(read(f"SELECT * FROM {DB}.nope", qid), deadline=soon())

    def state(origin: QueryOrigin | None) -> Termination:
        found = query_log_state(
            admin, qid, probe_id=f"{qid}-{time.time_ns()}", deadline=soon(), origin=origin
        )
        return found.termination

    ours = QueryOrigin(ADMIN_USER, DB, before, after)
    assert state(None) is Termination.UNKNOWN  # two runs that disagree: nothing proven
    assert state(ours) is Termination.FINISHED_OK
    assert state(QueryOrigin("reader", TEST_DATABASE, before, time.time())) is Termination.FAILED
    assert state(dataclasses.replace(ours, user="nobody")) is Termination.UNKNOWN
    assert state(dataclasses.replace(ours, database=TEST_DATABASE)) is Termination.UNKNOWN
    long_ago = QueryOrigin(ADMIN_USER, DB, before - 3600, before - 3000)
    assert state(long_ago) is Termination.UNKNOWN


# --- the client's caps, reaping and final deadline check


def test_the_client_output_cap_on_the_real_server(clickhouse: ServerInfo) -> None:
    t = make_transport("client", clickhouse, output_cap=4096)
    with pytest.raises(OutcomeUnknown) as caught:
        t.execute(
            read("SELECT number FROM numbers(100000) FORMAT TabSeparated", "r-capped"),
            deadline=soon(),
        )
    assert caught.value.code == "output_budget_exceeded"
    assert "4096" in str(caught.value)


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()  # a zombie (unreaped) still has its entry


def test_an_error_flood_is_capped_and_the_child_reaped(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    path = fake_client(
        tmp_path,
        f"""for a in "$@"; do [ "$a" = "--version" ] && exit 0; done
echo $$ > {pid_file}
while true; do echo "noise noise noise noise noise noise noise noise" >&2; done""",
    )
    t = make_transport("client", clickhouse, client_path=path, error_cap=2048)
    with pytest.raises(OutcomeUnknown) as caught:
        t.execute(read("SELECT 1", "r-flood"), deadline=soon())
    assert caught.value.code == "output_budget_exceeded" and "2048" in str(caught.value)
    assert gone(int(pid_file.read_text()))


def test_a_child_past_the_deadline_is_killed_and_reaped(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    path = fake_client(
        tmp_path,
        f"""for a in "$@"; do [ "$a" = "--version" ] && exit 0; done
echo $$ > {pid_file}.part && mv {pid_file}.part {pid_file}
echo started
exec sleep 60""",
    )

    def clock() -> float:
        # The deadline passes once the child runs (no race with its start-up). The pid
        # file appears whole (renamed into place): a file seen while ``echo`` still
        # wrote it was once empty when the test read it.
        return time.monotonic() + (1000.0 if pid_file.exists() else 0.0)

    t = make_transport("client", clickhouse, client_path=path, clock=clock)
    with pytest.raises(TransportDeadline) as caught:
        t.execute(read("SELECT 1", "r-sleeper"), deadline=soon())
    assert caught.value.details["submitted"] is True
    assert gone(int(pid_file.read_text()))


def test_an_exit_after_the_deadline_is_not_an_acknowledgment(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    exiting = tmp_path / "exiting"
    # Output closed early (the pump ends), then the exit comes late, with code 0.
    path = fake_client(
        tmp_path,
        f"""for a in "$@"; do [ "$a" = "--version" ] && exit 0; done
echo '{{"ok":1}}'
exec >&- 2>&-
sleep 2
touch {exiting}""",
    )

    def clock() -> float:
        # Once the child is on its way out, the deadline has passed.
        return time.monotonic() + (1000.0 if exiting.exists() else 0.0)

    t = make_transport("client", clickhouse, client_path=path, clock=clock)
    with pytest.raises(TransportDeadline) as caught:
        t.execute(read("SELECT 1", "r-late-exit"), deadline=soon())
    assert "after the final wait" in str(caught.value)
    assert caught.value.details["submitted"] is True


def test_the_client_ceiling_holds_while_the_body_streams(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    received = tmp_path / "received"
    path = fake_client(
        tmp_path,
        f"""for a in "$@"; do [ "$a" = "--version" ] && exit 0; done
cat > {received}""",
    )
    body = tmp_path / "spool"
    body.write_bytes(b"a" * 100_000)  # under the ceiling when it is opened

    def growing_clock() -> float:
        # The body grows once the client runs and reads it (its shell made ``received``
        # before cat reads): every check of the deadline while it streams adds more.
        # Counting clock calls instead would depend on how many checks (the version
        # probe's among them) come before the spool is opened.
        if received.exists():
            with body.open("ab") as more:
                more.write(b"b" * 65536)
        return time.monotonic()

    t = make_transport("client", clickhouse, client_path=path, clock=growing_clock)
    request = dataclasses.replace(
        read("INSERT INTO t FORMAT RowBinary", "r-grow"), body=body, max_body_bytes=150_000
    )
    with pytest.raises(OutcomeUnknown) as caught:
        t.execute(request, deadline=soon())
    assert caught.value.code == "body_limit_exceeded"
    assert received.stat().st_size <= 150_000  # no byte over the ceiling left
