"""A request whose deadline expired before sending settles as not sent (item 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_errors import NotSubmitted
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.staging.journal import read_events
from dpone.staging.service import ClickHouseValidatedFileService
from tests import chhttp
from tests.integration.test_staging import DB, Interfering, config, export_hostile, table_exists


def test_an_insert_never_sent_needs_no_termination_proof(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    chhttp.query(clickhouse.http_port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    path, receipt, _ = export_hostile(tmp_path)
    now = [0.0]

    def late(request: ClickHouseRequest) -> None:
        if request.query_id.endswith("-insert"):
            now[0] += 10_000.0  # the INSERT's deadline is spent before a byte leaves

    cfg = config(clickhouse, tmp_path / "work")
    inner = HttpTransport(cfg.endpoint, cfg.credentials, clock=lambda: now[0])
    svc = ClickHouseValidatedFileService(
        Interfering(inner, late), DB, tmp_path / "work", policy=cfg.policy, clock=lambda: now[0]
    )
    with pytest.raises(NotSubmitted) as caught:
        svc.stage(ContractValidatedFileArtifact(path, receipt), "unsent-insert-1")
    assert caught.value.code == "transport_deadline"
    assert caught.value.details["submitted"] is False
    events = [e.document for e in read_events(tmp_path / "work" / "unsent-insert-1")]
    # Not sent means not sent: no probes of the INSERT, the table dropped, all cleaned.
    assert not [e for e in events if e["outcome"] == "termination_observed"]
    assert events[-1]["state"] == "failed_cleaned"
    assert not table_exists(clickhouse, "dpone_stage_unsent_insert_1")
