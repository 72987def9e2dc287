"""A publication's ceilings hold while data streams into staging (SnapshotLimits L3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS
from dpone.errors import DponeError
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.ports.clickhouse_result import QueryResult
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.publication.composition import staging_policy
from dpone.staging.composition import build_transport
from dpone.staging.journal import file_journals
from dpone.staging.service import ClickHouseValidatedFileService
from tests.plugins.staging import DB, config, export_hostile

pytestmark = pytest.mark.usefixtures(
    "staging_database"
)  # the staging database and identity, for every test here


class Recording:
    """The real transport, remembering every request it was given."""

    def __init__(self, inner: QueryPort) -> None:
        self.inner = inner
        self.name = inner.name
        self.endpoint = getattr(inner, "endpoint", None)
        self.requests: list[ClickHouseRequest] = []

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        self.requests.append(request)
        return self.inner.execute(request, deadline=deadline)


def service(
    info: ServerInfo, work: Path, limits: object
) -> tuple[ClickHouseValidatedFileService, Recording]:
    cfg = config(info, work)
    policy = staging_policy(limits)  # type: ignore[arg-type]
    transport = Recording(build_transport(dataclasses.replace(cfg, policy=policy)))
    return (
        ClickHouseValidatedFileService(
            transport, DB, journal_factory=file_journals(work), policy=policy
        ),
        transport,
    )


def test_the_insert_body_carries_the_wire_ceiling(clickhouse: ServerInfo, tmp_path: Path) -> None:
    path, receipt, data = export_hostile(tmp_path)
    limits = dataclasses.replace(DEFAULT_LIMITS, wire_bytes=10_000_000, source_rows=len(data))
    svc, transport = service(clickhouse, tmp_path / "work", limits)
    staged = svc.stage(ContractValidatedFileArtifact(path, receipt), "ceiling-1")
    assert staged.rows == len(data)
    [insert] = [r for r in transport.requests if r.query_id.endswith("-insert")]
    assert insert.max_body_bytes == 10_000_000
    assert all(r.max_body_bytes is None for r in transport.requests if r.body is None)


@pytest.mark.parametrize(
    ("ceiling", "code"),
    [("source_rows", "too_many_records"), ("wire_bytes", "spool_budget_exceeded")],
)
def test_a_ceiling_stops_preparation_before_anything_remote(
    clickhouse: ServerInfo, tmp_path: Path, ceiling: str, code: str
) -> None:
    path, receipt, _ = export_hostile(tmp_path)
    limits = dataclasses.replace(DEFAULT_LIMITS, **{ceiling: 3 if ceiling == "source_rows" else 64})
    svc, transport = service(clickhouse, tmp_path / "work", limits)
    with pytest.raises(DponeError) as caught:
        svc.stage(ContractValidatedFileArtifact(path, receipt), f"ceiling-{ceiling}")
    assert caught.value.code == code, caught.value
    assert not [r for r in transport.requests if r.body is not None or "create" in r.query_id]
