"""The round trips of one staging (issue 33): every request is sequential, so each one
fewer is one network round trip fewer for a refresh.

The reads that prove the staging table the attempt's own are batched: the principal's
name and id in one request, the table's row and columns in one after the CREATE, and
the endpoint, the table, its COUNT and its stored bytes in one after the INSERT.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.endpoint_identity import EndpointIdentityError, observe_principal
from dpone.connectors.http_connections import POOL
from dpone.localserver import ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import build_transport
from tests import chhttp
from tests.plugins.managed_server import STAGER_PASSWORD
from tests.plugins.staging import (
    DB,
    Interfering,
    Wrapped,
    config,
    export_hostile,
    interfering_sink,
    runner,
    states,
)

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here


def test_one_staging_sends_ten_requests(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, data = export_hostile(tmp_path)
    sent: list[str] = []

    def record(request: ClickHouseRequest) -> None:
        sent.append(request.query_id.split("-trips-1-", 1)[-1])

    sink = interfering_sink(clickhouse, tmp_path / "work", record)
    before = POOL.thread_traffic()
    staged = sink.stage_validated_file(path, receipt, attempt_id="trips-1")
    traffic = POOL.thread_traffic().since(before)
    assert staged.rows == len(data)
    # Each request once, in this order; the session's SELECT 1 re-arms it before a write.
    assert [re.sub(r"-[0-9]+", "", s) for s in sent] == [
        "read-principal-user",  # currentUser() and its id
        "read-identity-endpoint",
        "read-absent",
        "read-session_open",
        "create",
        "read-table",  # the table's row and its columns
        "read-session_open",
        "insert",
        "read-verify",  # the endpoint, the table's row and columns, its stored bytes
        "read-count",  # the single COUNT: its own identified request (seed 001)
    ]
    assert traffic.requests == len(sent) == 10, traffic  # each one HTTP request


def principal_of(clickhouse: ServerInfo, credentials: Credentials) -> tuple[Any, int]:
    transport = HttpTransport(Endpoint("127.0.0.1", clickhouse.http_port, 0, DB), credentials)
    before = POOL.thread_traffic()
    principal = observe_principal(
        transport, credentials.user, probe_prefix="trips-principal", deadline=time.monotonic() + 30
    )
    return principal, POOL.thread_traffic().since(before).requests


def test_the_principal_and_its_id_are_one_request(clickhouse: ServerInfo) -> None:
    admin = admin_credentials(clickhouse.data_dir)
    [row] = chhttp.rows(
        clickhouse.http_port,
        f"SELECT toString(id) AS id FROM system.users WHERE name = '{admin.user}'",
    )
    assert principal_of(clickhouse, admin) == ({"user": admin.user, "user_uuid": row["id"]}, 1)


def test_a_user_who_may_not_read_system_users_is_still_checked(clickhouse: ServerInfo) -> None:
    # Code 497 for the request with system.users: currentUser() is then asked alone.
    stager = Credentials("stager", STAGER_PASSWORD)
    assert principal_of(clickhouse, stager) == ({"user": "stager", "user_uuid": None}, 2)
    with pytest.raises(EndpointIdentityError) as caught:
        observe_principal(
            HttpTransport(Endpoint("127.0.0.1", clickhouse.http_port, 0, DB), stager),
            "someone",
            probe_prefix="trips-other",
            deadline=time.monotonic() + 30,
        )
    assert caught.value.code == "principal_mismatch"


def test_a_batch_over_the_response_budget_is_asked_read_by_read(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    path, receipt, data = export_hostile(tmp_path)
    sizes: dict[str, int] = {}

    def measure(request: ClickHouseRequest, inner: Any, deadline: float) -> QueryResult:
        result: QueryResult = inner.execute(request, deadline=deadline)
        sizes[re.sub(r".*-read-([a-z_]+)-.*", r"\1", request.query_id)] = len(result.output)
        return result

    cfg = config(clickhouse, tmp_path / "work")
    ClickHouseSink(
        cfg, runner_factory=runner(Wrapped(build_transport(cfg), measure))
    ).stage_validated_file(path, receipt, attempt_id="sizes-1")
    # A budget the batch after the CREATE fits in (with room for the chunks' framing),
    # the one after the INSERT (the same reads and more) does not.
    budget = sizes["table"] + 64
    assert sizes["verify"] > budget + 64, sizes
    sent: list[str] = []

    def record(request: ClickHouseRequest) -> None:
        sent.append(re.sub(r"-[0-9]+", "", request.query_id.split("-budget-1-", 1)[-1]))

    inner = HttpTransport(cfg.endpoint, cfg.credentials, body_budget=budget)
    staged = ClickHouseSink(
        cfg, runner_factory=runner(Interfering(inner, record))
    ).stage_validated_file(path, receipt, attempt_id="budget-1")
    assert staged.rows == len(data)
    assert states(staged.journal_path)[-1] == "staged"
    # The batch's reads are asked again without it, each with its own checks: the
    # endpoint, the table's row and columns (one request, as after the CREATE), then
    # the COUNT, as always on its own, and the stored bytes.
    assert sent[sent.index("insert") + 1 :] == [
        "read-verify",
        "read-identity-endpoint",
        "read-table",
        "read-count",
        "read-stored_bytes",
    ]
