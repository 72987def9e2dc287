"""Both controlled transports against the real server: one contract, typed faults."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.endpoint_identity import (
    EndpointIdentityError,
    observe_identity,
    observe_principal,
    observe_server_id,
    observe_server_start,
    observe_user_uuid,
)
from dpone.connectors.remote_termination import (
    Termination,
    kill_query,
    prove_termination,
    query_log_state,
)
from dpone.localserver import LocalServer, ServerInfo
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import (
    ClickHouseServerError,
    NotSubmitted,
    OutcomeUnknown,
    TransportDeadline,
)
from dpone.ports.clickhouse_request import (
    ClickHouseRequest,
    mutation,
    mutation_query_id,
    read,
)
from dpone.ports.clickhouse_result import QueryResult
from tests import chhttp
from tests.plugins.managed_server import READER_PASSWORD, TEST_DATABASE
from tests.plugins.transports import DB, fake_client, make_transport, soon
from tests.profile_settings import ProfileSettings

Factory = Callable[..., Any]


@pytest.fixture
def kind(transport_kind: str, clickhouse: ServerInfo) -> str:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    return transport_kind


def spool(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "spool.rowbinary"
    path.write_bytes(
        b"".join(i.to_bytes(4, "little", signed=True) + b"\x03abc" for i in range(rows))
    )
    return path


def test_create_insert_count_drop(kind: str, clickhouse: ServerInfo, tmp_path: Path) -> None:
    t = make_transport(kind, clickhouse)
    table = f"{DB}.contract_{kind}"
    t.execute(
        mutation(
            f"CREATE TABLE {table} (id Int32, s String) ENGINE = MergeTree ORDER BY id",
            mutation_query_id(f"contract-{kind}", "create"),
        ),
        deadline=soon(),
    )
    data = spool(tmp_path, 5000)
    result = t.execute(
        mutation(
            f"INSERT INTO {table} FORMAT RowBinary",
            mutation_query_id(f"contract-{kind}", "insert"),
            body=data,
        ),
        deadline=soon(),
    )
    assert result.sent_bytes == data.stat().st_size
    assert result.sent_sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    rows = t.execute(
        read(
            f"SELECT count() AS n, sum(id) AS total FROM {table} FORMAT JSONEachRow", f"r-{kind}-1"
        ),
        deadline=soon(),
    ).json_rows()
    assert rows == [{"n": 5000, "total": sum(range(5000))}]
    assert type(rows[0]["n"]) is int
    t.execute(
        mutation(f"DROP TABLE {table}", mutation_query_id(f"contract-{kind}", "drop")),
        deadline=soon(),
    )
    assert chhttp.query(clickhouse.http_port, f"EXISTS TABLE {table}") == "0\n"
    # The server saw exactly these query ids, synchronously.
    chhttp.query(clickhouse.http_port, "SYSTEM FLUSH LOGS")
    logged = chhttp.rows(
        clickhouse.http_port,
        f"SELECT query_id, Settings['async_insert'] AS a FROM system.query_log WHERE query_id = 'dpone-b02-contract-{kind}-insert' AND type = 'QueryFinish'",
    )
    assert logged == [{"query_id": f"dpone-b02-contract-{kind}-insert", "a": "0"}]


def test_unknown_table_is_a_server_error(kind: str, clickhouse: ServerInfo) -> None:
    t = make_transport(kind, clickhouse)
    with pytest.raises(ClickHouseServerError) as caught:
        t.execute(
            read(
                f"SELECT count() FROM {DB}.does_not_exist FORMAT JSONEachRow", f"r-{kind}-missing"
            ),
            deadline=soon(),
        )
    assert caught.value.details["clickhouse_code"] == 60
    assert caught.value.details["query_id"] == f"r-{kind}-missing"


def test_permission_denied_for_restricted_user(kind: str, clickhouse: ServerInfo) -> None:
    chhttp.query(
        clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {TEST_DATABASE} ENGINE = Atomic"
    )
    t = make_transport(
        kind, clickhouse, user="reader", password=READER_PASSWORD, database=TEST_DATABASE
    )
    assert t.execute(
        read("SELECT 1 AS one FORMAT JSONEachRow", f"r-{kind}-reader"), deadline=soon()
    ).json_rows() == [{"one": 1}]
    with pytest.raises(ClickHouseServerError) as caught:
        t.execute(
            mutation(
                f"CREATE TABLE {TEST_DATABASE}.nope_{kind} (a Int8) ENGINE = Memory",
                f"m-{kind}-denied",
            ),
            deadline=soon(),
        )
    assert caught.value.details["clickhouse_code"] == 497
    assert READER_PASSWORD not in str(caught.value)
    wrong = make_transport(
        kind, clickhouse, user="reader", password="wrong", database=TEST_DATABASE
    )
    with pytest.raises(ClickHouseServerError) as auth:
        wrong.execute(read("SELECT 1", f"r-{kind}-wrong"), deadline=soon())
    assert auth.value.details["clickhouse_code"] == 516


def test_exception_after_rows_started_streaming(clickhouse: ServerInfo) -> None:
    t = make_transport("http", clickhouse)
    with pytest.raises(ClickHouseServerError) as caught:
        t.execute(
            read(
                "SELECT number, throwIf(number = 1500) FROM numbers(3000) SETTINGS max_block_size = 100 FORMAT TabSeparated",
                "r-after-200",
                stream_output=True,
            ),
            deadline=soon(),
        )
    assert caught.value.code == "exception_after_status"
    assert caught.value.details["clickhouse_code"] == 395


def test_client_reports_a_failure_after_rows_started(
    clickhouse: ServerInfo, clickhouse_client: str
) -> None:
    t = make_transport("client", clickhouse)
    with pytest.raises(ClickHouseServerError) as caught:
        t.execute(
            read(
                "SELECT number, throwIf(number = 1500) FROM numbers(3000) SETTINGS max_block_size = 100 FORMAT TabSeparated",
                "r-client-after-rows",
            ),
            deadline=soon(),
        )
    assert caught.value.details["clickhouse_code"] == 395


def test_deadline_expiry_while_slow_then_proven_by_kill(kind: str, clickhouse: ServerInfo) -> None:
    t = make_transport(kind, clickhouse)
    qid = f"r-{kind}-slow"
    with pytest.raises(TransportDeadline) as caught:
        t.execute(
            read(
                "SELECT sleepEachRow(0.5) FROM numbers(8) SETTINGS max_block_size = 1 FORMAT TabSeparated",
                qid,
            ),
            deadline=soon(1.0),
        )
    assert caught.value.details["submitted"] is True
    admin = make_transport("http", clickhouse)
    state = prove_termination(admin, qid, probe_prefix=f"probe-{kind}-slow", deadline=soon())
    assert state.proven_terminal, state


def test_kill_of_a_running_query(kind: str, clickhouse: ServerInfo) -> None:
    t = make_transport(kind, clickhouse)
    qid = f"r-{kind}-to-kill"
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            t.execute(
                read(
                    "SELECT sleepEachRow(0.5) FROM numbers(40) SETTINGS max_block_size = 1 FORMAT TabSeparated",
                    qid,
                ),
                deadline=soon(60),
            )
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    admin = make_transport("http", clickhouse)
    deadline = soon(20)
    while not chhttp.rows(
        clickhouse.http_port, f"SELECT 1 AS x FROM system.processes WHERE query_id = '{qid}'"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    state = kill_query(admin, qid, probe_id=f"kill-{kind}", deadline=soon())
    worker.join(30)
    assert state.termination is Termination.KILLED and state.source == "kill_sync"
    assert len(outcome) == 1 and isinstance(outcome[0], ClickHouseServerError | OutcomeUnknown)
    # A KILL naming a query that does not run proves nothing.
    assert (
        kill_query(
            admin, "no-such-query", probe_id=f"kill-none-{kind}", deadline=soon()
        ).termination
        is Termination.UNKNOWN
    )


def _client_runs(query_id: str) -> bool:
    """Whether a process runs with ``query_id`` as one argument (the client child)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue  # it exited meanwhile
        if query_id.encode() in argv:
            return True
    return False


def test_server_stopped_mid_insert_is_unknown_until_proven(
    kind: str, clickhouse: ServerInfo, tmp_path: Path
) -> None:
    with LocalServer(tmp_path / "victim") as victim:
        chhttp.register_server(victim.info.http_port, victim.info.data_dir)
        chhttp.query(victim.info.http_port, f"CREATE DATABASE {DB} ENGINE = Atomic")
        chhttp.query(
            victim.info.http_port,
            f"CREATE TABLE {DB}.t (id Int32, s String) ENGINE = MergeTree ORDER BY id",
        )
        calls = 0
        qid = mutation_query_id(f"victim-{kind}", "insert")

        def killing_clock() -> float:
            nonlocal calls
            # The client transport first asks the server (a read) whether the settings
            # the client cannot send hold: count from when the INSERT's own child runs.
            if kind == "http" or calls or _client_runs(qid):
                calls += 1
            if calls == 4:  # a few chunks in: the server dies mid-INSERT
                os.kill(victim.info.pid, signal.SIGKILL)
                time.sleep(0.3)
            return time.monotonic()

        t = make_transport(kind, victim.info, clock=killing_clock)
        with pytest.raises(OutcomeUnknown) as caught:
            t.execute(
                mutation(
                    f"INSERT INTO {DB}.t FORMAT RowBinary", qid, body=spool(tmp_path, 2_000_000)
                ),
                deadline=soon(60),
            )
        assert not isinstance(caught.value, NotSubmitted)
        victim._process.wait()  # type: ignore[union-attr]
        victim._process = None  # already dead; nothing to stop
    with LocalServer(tmp_path / "victim") as again:
        admin = make_transport("http", again.info)
        state = query_log_state(admin, qid, probe_id=f"after-{kind}", deadline=soon())
        # The kill lost the query log: the outcome stays unknown, never guessed.
        assert state.termination is Termination.UNKNOWN


def test_client_binary_missing(clickhouse: ServerInfo) -> None:
    t = make_transport("client", clickhouse, client_path="/nonexistent/clickhouse-client")
    with pytest.raises(NotSubmitted) as caught:
        t.execute(read("SELECT 1", "r-missing-client"), deadline=soon())
    assert caught.value.code == "client_missing"


def test_client_killed_by_signal(clickhouse: ServerInfo, tmp_path: Path) -> None:
    # Accepts the setting probe (--version), then dies by SIGKILL on the real call.
    path = fake_client(
        tmp_path, 'for a in "$@"; do [ "$a" = "--version" ] && exit 0; done\nkill -9 $$'
    )
    t = make_transport("client", clickhouse, client_path=path)
    with pytest.raises(OutcomeUnknown) as caught:
        t.execute(read("SELECT 1", "r-killed-client"), deadline=soon())
    assert caught.value.code == "client_killed" and caught.value.details["signal"] == 9


def test_client_credentials_stay_out_of_argv_and_are_removed(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    path = fake_client(
        tmp_path,
        f"""for a in "$@"; do [ "$a" = "--version" ] && exit 0; done
echo "$@" > {record}.argv
env > {record}.env
cfg=$2; stat -L -c %a "$cfg" > {record}.mode; cat "$cfg" > {record}.cfg; echo "$cfg" > {record}.path
echo '{{"ok":1}}'""",
    )
    t = make_transport(
        "client", clickhouse, user="reader", password=READER_PASSWORD, client_path=path
    )
    assert t.execute(read("SELECT 1", "r-fake"), deadline=soon()).json_rows() == [{"ok": 1}]
    assert READER_PASSWORD not in Path(f"{record}.argv").read_text()
    assert READER_PASSWORD not in Path(f"{record}.env").read_text()
    assert Path(f"{record}.mode").read_text().strip() == "600"
    assert READER_PASSWORD in Path(f"{record}.cfg").read_text()  # it did travel, privately
    # An anonymous memory file, never a name on disk (nothing to remove or leave behind).
    assert re.fullmatch(r"/dev/fd/[0-9]+", Path(f"{record}.path").read_text().strip())


def test_endpoint_identity_on_the_managed_server(clickhouse: ServerInfo) -> None:
    t = make_transport("http", clickhouse)
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    # Creating the identity is a journaled mutation of staging; here it exists already.
    chhttp.query(
        clickhouse.http_port, "CREATE DATABASE IF NOT EXISTS _dpone_identity ENGINE = Atomic"
    )
    first = observe_identity(t, DB, probe_prefix="ident-1", deadline=soon())
    second = observe_identity(t, DB, probe_prefix="ident-2", deadline=soon())
    assert first == second
    assert first.server_id_source == "dpone_identity_table"  # serverUUID() is Nil here
    assert first.server_id != "00000000-0000-0000-0000-000000000000"
    assert first.database_engine == "Atomic"
    with pytest.raises(EndpointIdentityError) as overlay:
        observe_identity(t, "default", probe_prefix="ident-3", deadline=soon())
    assert overlay.value.code == "database_not_atomic"
    with pytest.raises(EndpointIdentityError) as missing:
        observe_identity(t, "no_such_db", probe_prefix="ident-4", deadline=soon())
    assert missing.value.code == "database_missing"


def test_a_profile_cannot_turn_a_missing_database_into_a_server_error(
    clickhouse: ServerInfo,
) -> None:
    """empty_result_for_aggregation_by_empty_set = 1 in the user's profile: the endpoint's
    one request still answers an empty array for a database that does not exist."""
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    chhttp.query(
        clickhouse.http_port, "CREATE DATABASE IF NOT EXISTS _dpone_identity ENGINE = Atomic"
    )
    http = make_transport("http", clickhouse)
    assert isinstance(http, HttpTransport)
    t = ProfileSettings(http, empty_result_for_aggregation_by_empty_set="1")
    with pytest.raises(EndpointIdentityError) as missing:
        observe_identity(t, "no_such_db", probe_prefix="ident-profiled", deadline=soon())
    assert missing.value.code == "database_missing"
    assert observe_server_id(t, probe_prefix="ident-profiled-2", deadline=soon())[1] == (
        "dpone_identity_table"
    )


class WithoutMember:
    """The real transport, with ``member`` taken out of the rows of queries ending in
    ``suffix``: a malformed control row, a fault a real server cannot produce."""

    def __init__(self, inner: QueryPort, suffix: str, member: str) -> None:
        self.inner, self.suffix, self.member = inner, suffix, member
        self.name = inner.name

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        result = self.inner.execute(request, deadline=deadline)
        if not request.query_id.endswith(self.suffix):
            return result
        rows = [self.rewrite(row) for row in result.json_rows()]
        output = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
        return dataclasses.replace(result, output=output)

    def rewrite(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row as this port hands it on: without ``member``."""
        return {k: v for k, v in row.items() if k != self.member}


@pytest.mark.parametrize(
    ("suffix", "member"),
    [
        ("-endpoint", "id"),
        ("-endpoint", "identity"),
        ("-endpoint", "database_uuid"),
        ("-endpoint", "database_engine"),
    ],
)
def test_a_control_row_without_a_member_is_a_named_error(
    clickhouse: ServerInfo, suffix: str, member: str
) -> None:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    chhttp.query(
        clickhouse.http_port, "CREATE DATABASE IF NOT EXISTS _dpone_identity ENGINE = Atomic"
    )
    t = WithoutMember(make_transport("http", clickhouse), suffix, member)
    with pytest.raises(EndpointIdentityError) as caught:
        observe_identity(t, DB, probe_prefix="ident-member", deadline=soon())
    error = caught.value
    assert error.code == "identity_unobservable"
    assert error.details == {"query_id": f"ident-member{suffix}", "member": member}
    assert f"ident-member{suffix}" in error.message and repr(member) in error.message
    assert isinstance(error.__cause__, KeyError)


class WithMember(WithoutMember):
    """The real transport, with ``member`` of the rows of queries ending in ``suffix``
    replaced by ``value``: a control row of the wrong shape."""

    def __init__(self, inner: QueryPort, suffix: str, member: str, value: object) -> None:
        super().__init__(inner, suffix, member)
        self.value = value

    def rewrite(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row with ``member`` set to ``value``."""
        return {**row, self.member: self.value}


@pytest.mark.parametrize(
    ("member", "value"),
    [("id", 7), ("identity", "x"), ("database_uuid", [1]), ("database_engine", None)],
)
def test_an_endpoint_row_of_the_wrong_shape_is_a_named_error(
    clickhouse: ServerInfo, member: str, value: object
) -> None:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    chhttp.query(
        clickhouse.http_port, "CREATE DATABASE IF NOT EXISTS _dpone_identity ENGINE = Atomic"
    )
    t = WithMember(make_transport("http", clickhouse), "-endpoint", member, value)
    with pytest.raises(EndpointIdentityError) as caught:
        observe_identity(t, DB, probe_prefix="ident-shape", deadline=soon())
    assert caught.value.code == "identity_unobservable"
    assert caught.value.details == {"query_id": "ident-shape-endpoint", "member": member}


@pytest.mark.parametrize(
    ("call", "suffix", "member"),
    [
        (lambda t: observe_principal(t, None, probe_prefix="p", deadline=soon()), "p-user", "user"),
        (
            lambda t: observe_user_uuid(t, "dpone_admin", query_id="p-uid", deadline=soon()),
            "p-uid",
            "id",
        ),
        (lambda t: observe_server_start(t, query_id="p-up", deadline=soon()), "p-up", "up"),
    ],
    ids=["principal", "user_uuid", "server_start"],
)
def test_who_and_since_when_without_a_member_are_named_errors(
    clickhouse: ServerInfo, call: Callable[[Any], object], suffix: str, member: str
) -> None:
    t = WithoutMember(make_transport("http", clickhouse), suffix, member)
    with pytest.raises(EndpointIdentityError) as caught:
        call(t)
    assert caught.value.details == {"query_id": suffix, "member": member}
    assert isinstance(caught.value.__cause__, KeyError)
