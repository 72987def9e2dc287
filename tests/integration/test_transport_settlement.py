"""A request whose deadline expired before sending settles as not sent (item 13)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import staging_table_name
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import NotSubmitted
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import StagingConfig
from dpone.staging.journal import read_events
from tests import chhttp
from tests.plugins.staging import DB, Interfering, config, export_hostile, table_exists


def test_an_insert_never_sent_needs_no_termination_proof(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    path, receipt, _ = export_hostile(tmp_path)
    skew = [0.0]

    def late(request: ClickHouseRequest) -> None:
        # For the INSERT alone, the transport's clock is past every deadline: its
        # deadline is spent before a byte leaves. Every other request runs in time.
        skew[0] = 10_000.0 if request.query_id.endswith("-insert") else 0.0

    def transport(cfg: StagingConfig) -> QueryPort:
        clock = lambda: time.monotonic() + skew[0]  # noqa: E731 - the transport's clock only
        return Interfering(HttpTransport(cfg.endpoint, cfg.credentials, clock=clock), late)

    sink = ClickHouseSink(config(clickhouse, tmp_path / "work"), transport_factory=transport)
    with pytest.raises(NotSubmitted) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="unsent-insert-1")
    assert caught.value.code == "transport_deadline"
    assert caught.value.details["submitted"] is False
    events = [e.document for e in read_events(tmp_path / "work" / "unsent-insert-1")]
    # Not sent means not sent: no probes of the INSERT, the table dropped, all cleaned.
    assert not [e for e in events if e["outcome"] == "termination_observed"]
    assert events[-1]["state"] == "failed_cleaned"
    # The table the attempt created (its name from the code, never spelled by hand: an
    # old spelling names a table that never existed, and its absence proves nothing).
    table = staging_table_name("unsent-insert-1")
    assert events[0]["planned_ownership"]["table"] == table
    # The one creation, the INSERT never sent, the drop (the identity may come first).
    intents = [e["query"]["kind"] for e in events if e["outcome"] in ("intent", "drop_intent")]
    assert [k for k in intents if k != "identity"] == ["create", "insert", "drop"]
    assert not table_exists(clickhouse, table)
