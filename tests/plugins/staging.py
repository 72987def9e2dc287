"""Staging on the session's server: the hostile-values export, the staging
configuration and database, wrapped transports that fake what a server cannot do, and
a stager child killed mid-journal."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.localserver import ServerInfo, admin_credentials
from dpone.ports.clickhouse_request import ClickHouseRequest, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import StagingConfig, build_transport
from dpone.staging.contract import StagingPolicy
from dpone.staging.journal import file_journals, read_events
from dpone.staging.service import ClickHouseValidatedFileService
from tests import chhttp
from tests.hostile_values import HOSTILE_BINARY, HOSTILE_TEXT

DB = "staging_db"


def export_hostile(
    tmp_path: Path, rows: int | None = None
) -> tuple[Path, Path, list[tuple[Any, ...]]]:
    """A hostile-values table with types every client can insert."""
    data: list[tuple[Any, ...]] = [(i, t, None, None) for i, t in enumerate(HOSTILE_TEXT)]
    data += [
        (1000 + i, None, b, "6F9619FF-8B86-D011-B42D-00C04FC964FF")
        for i, b in enumerate(HOSTILE_BINARY)
    ]
    data += [(5000, "dup", b"d", None)] * 2
    if rows is not None:
        data = data[:rows]
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE t (id bigint NOT NULL, txt nvarchar, bin varbinary, g uniqueidentifier)"
        )
        conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", data)
    result = export_table(SqliteSource(db), "t", tmp_path / "t.tsv")
    return result.path, result.receipt_path, data


def config(info: ServerInfo, work: Path, kind: str = "http", **policy: Any) -> StagingConfig:
    return StagingConfig(
        Endpoint("127.0.0.1", info.http_port, info.tcp_port, DB),
        admin_credentials(info.data_dir),
        work,
        transport=kind,
        policy=StagingPolicy(**policy),
    )


@pytest.fixture
def staging_database(clickhouse: ServerInfo) -> None:
    """The Atomic database, and the server's dpone identity (so event numbers are fixed).

    Not autouse: a module whose every test needs it says
    ``pytestmark = pytest.mark.usefixtures("staging_database")``."""
    create_databases(clickhouse.http_port)


def create_databases(port: int) -> None:
    chhttp.query(port, f"CREATE DATABASE IF NOT EXISTS {DB} ENGINE = Atomic")
    chhttp.query(port, "CREATE DATABASE IF NOT EXISTS _dpone_identity ENGINE = Atomic")


def table_exists(info: ServerInfo, table: str) -> bool:
    return chhttp.query(info.http_port, f"EXISTS TABLE {DB}.{table}") == "1\n"


def states(attempt_dir: Path) -> list[str]:
    return [e.document["state"] for e in read_events(attempt_dir)]


# A hook's answer: the result to hand on instead of the server's, or a function that
# makes it from the server's result, or None (the server's result, as it is).
Replacement = QueryResult | Callable[[QueryResult], QueryResult] | None


class Interfering:
    """A real transport with a hook that runs before chosen requests (faults a server cannot make)."""

    def __init__(self, inner: Any, hook: Callable[[ClickHouseRequest], Replacement]) -> None:
        self.inner = inner
        self.name = inner.name
        self.endpoint = inner.endpoint
        self.hook = hook

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        replaced = self.hook(request)
        result: QueryResult = self.inner.execute(request, deadline=deadline)
        if callable(replaced):
            return replaced(result)
        return replaced if replaced is not None else result


def rewrite_read(
    read: str, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
) -> Callable[[QueryResult], QueryResult]:
    """The batched result with the rows of its ``read`` (``table``, ``count``...) changed."""

    def rewrite(result: QueryResult) -> QueryResult:
        [row] = result.json_rows()
        rows = [json.loads(line) for line in row[f"r_{read}"]]
        row[f"r_{read}"] = [json.dumps(r) for r in change(rows)]
        return dataclasses.replace(result, output=json.dumps(row).encode() + b"\n")

    return rewrite


def runner(inner: Any) -> Any:
    """A ``runner_factory`` that hands the sink's service ``inner`` (a wrapped transport)."""

    def factory(cfg: StagingConfig, policy: StagingPolicy) -> Any:
        assert policy == cfg.policy  # the service's policy reaches the factory
        return inner

    return factory


def interfering_sink(
    info: ServerInfo,
    work: Path,
    hook: Callable[[ClickHouseRequest], Replacement],
    **policy: Any,
) -> ClickHouseSink:
    """The public sink whose service runs through a real transport with ``hook``."""
    cfg = config(info, work, **policy)
    return ClickHouseSink(cfg, runner_factory=runner(Interfering(build_transport(cfg), hook)))


def fake_count(output: bytes) -> Callable[[ClickHouseRequest], Replacement]:
    """COUNT (its own request after the INSERT) answers ``output``."""

    def hook(request: ClickHouseRequest) -> Replacement:
        if "-read-count-" in request.query_id:
            return QueryResult(request.query_id, output, None, None, "http")
        return None

    return hook


def documents(attempt_dir: Path) -> list[dict[str, Any]]:
    return [e.document for e in read_events(attempt_dir)]


class Wrapped:
    """A real transport; ``fault(request, inner, deadline)`` may take over one request."""

    def __init__(
        self, inner: Any, fault: Callable[[ClickHouseRequest, Any, float], QueryResult | None]
    ) -> None:
        self.inner, self.fault = inner, fault
        self.name, self.endpoint = inner.name, inner.endpoint

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        taken = self.fault(request, self.inner, deadline)
        if taken is not None:
            return taken
        result: QueryResult = self.inner.execute(request, deadline=deadline)
        return result


def wrapped_transport(cfg: Any, fault: Any, count: bytes | None) -> Wrapped:
    """A real transport; ``fault`` may take over a request, ``count`` replaces the COUNT."""
    inner: Any = build_transport(cfg)
    if count is not None:
        inner = Interfering(inner, fake_count(count))
    return Wrapped(inner, fault)


def wrapped_service(
    info: ServerInfo, work: Path, fault: Any, count: bytes | None = b'{"n":1}\n'
) -> ClickHouseValidatedFileService:
    """The service itself around :func:`wrapped_transport` (for callers that need it)."""
    cfg = config(info, work)
    return ClickHouseValidatedFileService(
        wrapped_transport(cfg, fault, count),
        DB,
        journal_factory=file_journals(work),
        policy=cfg.policy,
    )


# Stages one attempt through the public composition as the administrator and dies
# (SIGKILL) right after the first event that ``when`` describes: ``acked`` (the
# INSERT acknowledged, recorded as settled) or ``unsent`` (the INSERT's intent; the
# INSERT itself is never sent). Credentials come through the environment.
CHILD = textwrap.dedent(
    f"""
    import os, signal, sys
    from pathlib import Path
    from dpone.staging import journal as journal_module
    from dpone.ports.clickhouse_request import Credentials, Endpoint
    from dpone.staging.contract import StagingPolicy
    from dpone.staging.composition import StagingConfig, build_clickhouse_staging_components
    from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact

    http, tcp, work, path, receipt, attempt, when, seconds = sys.argv[1:]
    record = journal_module.ClickHouseFileAttemptJournal.record

    def crashing(self, fields):
        event = record(self, fields)
        query = fields.get("query") or {{}}
        settled = fields.get("settled") or {{}}
        if (when == "unsent" and query.get("kind") == "insert") or (
            when == "acked" and str(settled.get("query_id")).endswith("-insert")
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        return event

    journal_module.ClickHouseFileAttemptJournal.record = crashing
    admin = Credentials(os.environ["DPONE_TEST_USER"], os.environ["DPONE_TEST_PASSWORD"])
    cfg = StagingConfig(
        Endpoint("127.0.0.1", int(http), int(tcp), "{DB}"),
        admin,
        Path(work),
        policy=StagingPolicy(request_seconds=float(seconds)),
    )
    build_clickhouse_staging_components(cfg).validated_file.stage(
        ContractValidatedFileArtifact(Path(path), Path(receipt)), attempt
    )
    """
)


def crash(
    info: ServerInfo, work: Path, files: tuple[Path, Path], attempt: str, when: str, seconds: float
) -> list[dict[str, Any]]:
    """Stage ``files`` on ``info`` in a child that dies as ``when`` says; the journal."""
    path, receipt = files
    admin = admin_credentials(info.data_dir)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(info.http_port),
            str(info.tcp_port),
            str(work),
            str(path),
            str(receipt),
            attempt,
            when,
            str(seconds),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "DPONE_TEST_USER": admin.user, "DPONE_TEST_PASSWORD": admin.password},
    )
    assert child.returncode == -9, child.stderr
    return [e.document for e in read_events(work / attempt)]


HOSTILE_DDL = (
    "CREATE TABLE hostile (id bigint NOT NULL, txt nvarchar, bin varbinary, "
    "amount decimal(18, 4), ts datetime2(7), g uniqueidentifier)"
)


def make_hostile_db(path: Path) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for i, text in enumerate(HOSTILE_TEXT):
        rows.append((i, text, None, "12.5000", "2020-01-02 03:04:05.1234567", None))
    for j, blob in enumerate(HOSTILE_BINARY):
        rows.append((1000 + j, None, blob, None, None, "6F9619FF-8B86-D011-B42D-00C04FC964FF"))
    rows += [(5000, "dup", b"d", "-1.5", None, None)] * 2
    with sqlite3.connect(path) as conn:
        conn.execute(HOSTILE_DDL)
        conn.executemany("INSERT INTO hostile VALUES (?, ?, ?, ?, ?, ?)", rows)
    return rows
