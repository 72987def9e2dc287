"""A server switched under the service (issue 26, item 2), on two real managed servers.

Server A (the session's) is where the attempt begins; server B is a second managed
server. The transport answers as A until a chosen mutation has been acknowledged, then
as B (an endpoint that fails over, a name that now resolves elsewhere). Through B the
staging table looks missing; "missing" must never read as "nothing was created": the
attempt ends ``retained_unknown`` with the table left on A, its spool and journal kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError
from dpone.localserver import LocalServer, ServerInfo
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.ports.clickhouse_result import QueryResult
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import build_transport
from dpone.staging.journal import read_events
from tests import chhttp
from tests.plugins.staging import DB, config, create_databases, export_hostile, runner, table_exists

pytestmark = pytest.mark.usefixtures(
    "staging_database"
)  # the databases on server A, for every test here


@pytest.fixture(scope="module")
def server_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A second managed server with the same databases (its own identity)."""
    with LocalServer(tmp_path_factory.mktemp("server_b")) as server:
        chhttp.register_server(server.info.http_port, server.info.data_dir)
        create_databases(server.info.http_port)
        yield server.info


class Switching:
    """Real transports to A and B: A's until the mutation ending in ``after`` returned."""

    def __init__(self, a: Any, b: Any, after: str) -> None:
        self.a, self.b, self.after = a, b, after
        self.name, self.endpoint = a.name, a.endpoint
        self.switched = False

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        current = self.b if self.switched else self.a
        result: QueryResult = current.execute(request, deadline=deadline)
        if request.query_id.endswith(self.after):
            self.switched = True
        return result


def identity_of(info: ServerInfo) -> str:
    [row] = chhttp.rows(
        info.http_port,
        "SELECT toString(uuid) AS id FROM system.databases WHERE name = '_dpone_identity'",
    )
    return str(row["id"])


def stage_switching(
    a: ServerInfo, b: ServerInfo, work: Path, after: str, attempt: str
) -> tuple[DponeError, list[dict[str, Any]]]:
    path, receipt, _ = export_hostile(work.parent)
    cfg = config(a, work)
    switching = Switching(build_transport(cfg), build_transport(config(b, work)), after)
    with pytest.raises(DponeError) as caught:
        ClickHouseSink(cfg, runner_factory=runner(switching)).stage_validated_file(
            path, receipt, attempt_id=attempt
        )
    assert switching.switched
    return caught.value, [e.document for e in read_events(work / attempt)]


def assert_retained_on_a(
    a: ServerInfo, b: ServerInfo, work: Path, attempt: str, docs: list[dict[str, Any]]
) -> None:
    table = "dpone_stage_" + attempt.replace("-", "_h")
    last = docs[-1]
    assert last["state"] == "retained_unknown"
    assert last["endpoint_identity"]["server_id"] == identity_of(a)  # bound to A throughout
    assert last["cleanup_inventory"]["table"]["table"] == table
    assert table_exists(a, table)  # left where it was created, for recovery against A
    assert chhttp.query(b.http_port, f"EXISTS TABLE {DB}.{table}") == "0\n"
    assert (work / attempt / "spool" / "data.rowbinary").exists()
    assert not any(d["outcome"] == "drop_intent" for d in docs)  # nothing dropped anywhere
    assert last["cleanup_inventory"]["endpoint_changed"]["server_id"] == identity_of(b)


def test_a_switch_after_the_insert_is_endpoint_changed_and_retains_everything(
    clickhouse: ServerInfo, server_b: ServerInfo, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    error, docs = stage_switching(clickhouse, server_b, work, "-insert", "switch-insert-1")
    # The endpoint is checked before the table: not table_missing, its own outcome.
    assert error.code == "endpoint_changed", error
    assert error.details["before"]["server_id"] == identity_of(clickhouse)
    assert error.details["after"]["server_id"] == identity_of(server_b)
    assert docs[-1]["error_code"] == "endpoint_changed"
    assert_retained_on_a(clickhouse, server_b, work, "switch-insert-1", docs)
    rows = chhttp.query(
        clickhouse.http_port, f"SELECT count() FROM {DB}.dpone_stage_switch_hinsert_h1"
    )
    assert int(rows) == docs[-1]["counts"]["prepared_rows"] > 0  # the INSERT landed on A


def test_a_switch_after_the_create_never_reads_missing_as_nothing_created(
    clickhouse: ServerInfo, server_b: ServerInfo, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    error, docs = stage_switching(clickhouse, server_b, work, "-create", "switch-create-1")
    # Through B the new table is missing; cleanup asks B who it is before believing it.
    assert error.code == "table_missing", error
    notes = " ".join(getattr(error, "__notes__", []))
    assert "endpoint's identity changed" in notes and "at cleanup" in notes, notes
    assert_retained_on_a(clickhouse, server_b, work, "switch-create-1", docs)
