"""Publication on a real managed server for fault tests, and crash points in a child process.

The rig stages real files through a leased ingest principal and builds the publisher
with :func:`dpone.publication.composition.build_publication`, exactly as the CLI
does. Faults come from test-side subclasses of the real adapters, swapped in only while
``build_publication`` assembles them (:func:`build`); production code has no hooks
for them beyond the store's documented test seams.

Run as a program, this module publishes one intent and SIGKILLs itself at one exact
boundary::

    python -m tests.publication_harness POINT --data-dir D --store S --database DB INTENT

``after-claim``: right after the claim's COMMIT returned; ``after-send``: after the
EXCHANGE request's last byte was handed to the socket, before any answer was read;
``after-answer``: after the EXCHANGE's complete acknowledgment, before the record.

With ``stop-`` before a step name (:data:`STOP_STEPS`) the child publishes through the
library and SIGSTOPs itself once at that step instead, so that another process can act
while it is stopped; after SIGCONT it carries on and prints its answer (``state@rev``
or the error's code) on stdout. ``reconcile`` reconciles the intent once and prints
the same.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import http.client
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.errors import DponeError
from dpone.exporters.export import export_table
from dpone.exporters.sources import SqliteSource
from dpone.localserver import LocalServer
from dpone.localserver.principal_pool import managed_server_users
from dpone.ports.clickhouse_request import ClickHouseRequest, Endpoint
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import AttemptRef, IssuedPrincipal, TargetSlot
from dpone.publication import composition as snapshot_composition
from dpone.publication.authority.snapshot_authority import SnapshotAuthority
from dpone.publication.composition import (
    PublicationComponents,
    PublicationConfig,
    build_publication,
    ingest_session_notes,
    issue_ingest,
    provision_protected_databases,
)
from dpone.publication.dispatch.executor import ClickHouseSnapshotExecutor
from dpone.publication.publisher import PublicationReceipt
from dpone.publication.store import SqliteSnapshotStore
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import StagingConfig
from dpone.staging.service import StagedTable
from tests import chhttp

REPOSITORY = Path(__file__).resolve().parents[1]
Row = tuple[int, str | None, int | None]
CRASH_POINTS = ("after-claim", "after-send", "after-answer")
# Where a holder stops itself between the claim and the EXCHANGE (see the module doc).
STOP_STEPS = (
    "after-claim",
    "after-credentials",
    "before-gate",
    "after-session",
    "before-exchange",
)


def is_exchange(request: ClickHouseRequest) -> bool:
    """The publication's EXCHANGE (``dpone-s00-<intent[:32]>-exchange``)."""
    return request.query_id is not None and request.query_id.endswith("-exchange")


def die() -> None:
    """SIGKILL this process: no handler, no cleanup, no flush."""
    os.kill(os.getpid(), signal.SIGKILL)


class KillAfterClaimStore(SqliteSnapshotStore):
    """Dies right after the first compare-and-set (publish's claim) committed."""

    def _after_commit(self, operation: str) -> None:
        if operation == "compare_and_set":
            die()


class KillAfterSendTransport(HttpTransport):
    """Dies once the EXCHANGE request has been sent, before reading any answer."""

    def _before_send(
        self, conn: http.client.HTTPConnection, deadline: float, request: ClickHouseRequest
    ) -> None:
        if is_exchange(request):
            die()
        super()._before_send(conn, deadline, request)


class KillAfterAnswerTransport(HttpTransport):
    """Dies after the EXCHANGE's complete acknowledgment, before the caller sees it."""

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        result = super().execute(request, deadline=deadline)
        if is_exchange(request):
            die()
        return result


_stopped: set[str] = set()


def stop_once(step: str) -> None:
    """SIGSTOP this process the first time ``step`` is reached (a stall of any length)."""
    if step not in _stopped:
        _stopped.add(step)
        os.kill(os.getpid(), signal.SIGSTOP)


class StopAfterClaimStore(SqliteSnapshotStore):
    """Stops right after the claim's compare-and-set committed."""

    def _after_commit(self, operation: str) -> None:
        if operation == "compare_and_set":
            stop_once("after-claim")


class StopAfterCredentialsAuthority(SnapshotAuthority):
    """Stops right after the publisher's credentials were handed out."""

    def publisher_credentials(self, intent: SnapshotIntent) -> IssuedPrincipal:
        issued = super().publisher_credentials(intent)
        stop_once("after-credentials")
        return issued


class StopBeforeGateExecutor(ClickHouseSnapshotExecutor):
    """Stops in the executor before it takes the dispatch gate."""

    def exchange(self, intent: SnapshotIntent, principal: IssuedPrincipal) -> Any:
        stop_once("before-gate")
        return super().exchange(intent, principal)


class StopInSessionTransport(HttpTransport):
    """Stops after the session-open request answered, or before the EXCHANGE is sent."""

    step = "after-session"

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        if self.step == "before-exchange" and is_exchange(request):
            stop_once(self.step)
        result = super().execute(request, deadline=deadline)
        if self.step == "after-session" and str(request.query_id).endswith("-session-open"):
            stop_once(self.step)
        return result


class StopBeforeExchangeTransport(StopInSessionTransport):
    step = "before-exchange"


def _stop_swaps(step: str) -> dict[str, Any]:
    if step == "after-claim":
        return {"store": StopAfterClaimStore}
    if step == "after-credentials":
        return {"authority": StopAfterCredentialsAuthority}
    if step == "before-gate":
        return {"executor": StopBeforeGateExecutor}
    transport = StopInSessionTransport if step == "after-session" else StopBeforeExchangeTransport
    return {"executor": functools.partial(ClickHouseSnapshotExecutor, transport_factory=transport)}


@contextlib.contextmanager
def swapped(
    *,
    store: type[SqliteSnapshotStore] | None = None,
    executor: Any = None,
    authority: Any = None,
) -> Iterator[None]:
    """Let ``build_publication`` assemble these test-side classes instead of the real ones."""
    with contextlib.ExitStack() as stack:
        if store is not None:
            kind = store

            def opened(location: Any, **options: Any) -> SqliteSnapshotStore:
                return kind(Path(location), **options)

            stack.enter_context(mock.patch.object(snapshot_composition, "open_store", opened))
        if executor is not None:
            stack.enter_context(
                mock.patch.object(snapshot_composition, "ClickHouseSnapshotExecutor", executor)
            )
        if authority is not None:
            stack.enter_context(
                mock.patch.object(snapshot_composition, "SnapshotAuthority", authority)
            )
        yield


def build(config: PublicationConfig, database: str, **swaps: Any) -> PublicationComponents:
    """``build_publication`` with test-side adapter classes (see :func:`swapped`)."""
    with swapped(**swaps):
        return build_publication(config, database)


def managed_publication_server(
    tmp_path_factory: Any, label: str, database: str
) -> Iterator[tuple[Path, int, int]]:
    """A managed server protecting ``database``, as ``dpone server start --protect`` makes
    it: (data dir, HTTP port, native port) while it runs."""
    data_dir = tmp_path_factory.mktemp(label) / "ch"
    server = LocalServer(data_dir, users=managed_server_users((database,)))
    info = server.start()
    try:
        provision_protected_databases(data_dir, info.http_port, (database,))
        chhttp.register_server(info.http_port, data_dir)
        yield data_dir, info.http_port, info.tcp_port
    finally:
        server.stop()


@dataclass(frozen=True)
class Rig:
    """One test's sources, work directory and store on a managed server's database."""

    data_dir: Path
    http_port: int
    tcp_port: int
    database: str
    root: Path

    @property
    def store_path(self) -> Path:
        return self.root / "snapshots.sqlite"

    def config(self, claim_wait_seconds: float = 30.0) -> PublicationConfig:
        return PublicationConfig(
            self.data_dir, self.store_path, claim_wait_seconds=claim_wait_seconds
        )

    def components(self, **swaps: Any) -> PublicationComponents:
        return build(self.config(), self.database, **swaps)

    def stage(self, rows: list[Row], attempt_id: str) -> StagedTable:
        """Export ``rows`` from a SQLite source and stage them as a leased ingest user."""
        return self.stage_leased(rows, attempt_id)[0]

    def stage_leased(
        self,
        rows: list[Row],
        attempt_id: str,
        transport_factory: Any = None,
        **changes: Any,
    ) -> tuple[StagedTable, IssuedPrincipal]:
        """:meth:`stage`, with ``changes`` to the StagingConfig; also the ingest principal.

        ``transport_factory`` is the sink's (None: the production default).

        As ``dpone refresh`` and ``dpone stage`` do, the drain gate notes its session
        under the ingest lease, so that prepare's closure waits for it and probes it.
        """
        source = self.root / f"{attempt_id}.db"
        with contextlib.closing(sqlite3.connect(source)) as conn, conn:
            conn.execute("CREATE TABLE items (id bigint NOT NULL, name nvarchar(50), qty int)")
            conn.executemany("INSERT INTO items VALUES (?, ?, ?)", rows)
        exported = export_table(SqliteSource(source), "items", self.root / f"{attempt_id}.tsv")
        ingest = issue_ingest(self.data_dir, self.store_path, self.database, attempt_id)
        endpoint = Endpoint("127.0.0.1", self.http_port, self.tcp_port, self.database)
        config = StagingConfig(
            endpoint,
            ingest.credentials,
            self.root / "attempts",
            principal_uuid=ingest.ref.user_uuid,
            session_notes=ingest_session_notes(self.store_path, ingest.ref.lease_id),
        )
        sink = ClickHouseSink(
            dataclasses.replace(config, **changes), transport_factory=transport_factory
        )
        staged = sink.stage_validated_file(
            exported.path, exported.receipt_path, attempt_id=attempt_id
        )
        return staged, ingest

    def existing_target(self, staged: StagedTable, name: str, rows: list[Row]) -> str:
        """A user's target (A) with the generation's design and ``rows``; its UUID."""
        db = self.database
        self.admin(f"CREATE TABLE {db}.{name} AS {db}.{staged.table}")
        # The copied first-column comment is the staging attempt's ownership mark.
        self.admin(f"ALTER TABLE {db}.{name} COMMENT COLUMN id ''")
        if rows:
            values = ", ".join(
                "(" + ", ".join("NULL" if v is None else repr(v) for v in row) + ")" for row in rows
            )
            self.admin(f"INSERT INTO {db}.{name} VALUES {values}")
        found = self.uuid_of(name)
        assert found is not None
        return found

    def prepare(self, staged: StagedTable, target: str) -> PublicationReceipt:
        slot = TargetSlot(self.database, target)
        return self.components().publisher.prepare(
            AttemptRef(staged.journal_path, slot), staged.journal_head
        )

    def child_argv(self, point: str, intent: str) -> list[str]:
        """The command line of a harness child at ``point`` on ``intent``."""
        return [
            sys.executable,
            "-m",
            "tests.publication_harness",
            point,
            "--data-dir",
            str(self.data_dir),
            "--store",
            str(self.store_path),
            "--database",
            self.database,
            intent,
        ]

    def crash(self, point: str, intent: str) -> subprocess.CompletedProcess[str]:
        """Publish ``intent`` in a child process that SIGKILLs itself at ``point``."""
        return subprocess.run(
            self.child_argv(point, intent),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            cwd=REPOSITORY,
        )

    def child(self, point: str, intent: str) -> subprocess.Popen[str]:
        """Start a harness child (``stop-<step>`` or ``reconcile``) without waiting."""
        return subprocess.Popen(
            self.child_argv(point, intent),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPOSITORY,
        )

    # ---------------------------------------------------------------- server reads

    def admin(self, sql: str) -> str:
        return chhttp.query(self.http_port, sql)

    def uuid_of(self, table: str) -> str | None:
        found = chhttp.rows(
            self.http_port,
            "SELECT toString(uuid) AS uuid FROM system.tables WHERE "
            f"database = '{self.database}' AND name = '{table}'",
        )
        return found[0]["uuid"] if found else None

    def rows_of(self, table: str) -> list[Row]:
        found = chhttp.rows(
            self.http_port, f"SELECT id, name, qty FROM {self.database}.{table} ORDER BY id"
        )
        return [(r["id"], r["name"], r["qty"]) for r in found]

    def exchange_events(self, intent: str) -> list[str]:
        """The EXCHANGE's query_log event types, after SYSTEM FLUSH LOGS as the admin."""
        self.admin("SYSTEM FLUSH LOGS")
        found = chhttp.rows(
            self.http_port,
            "SELECT toString(type) AS type FROM system.query_log WHERE query_id = "
            f"'dpone-s00-{intent[:32]}-exchange' ORDER BY event_time_microseconds, type",
        )
        return [r["type"] for r in found]


def _crash_swaps(point: str) -> dict[str, Any]:
    if point == "after-claim":
        return {"store": KillAfterClaimStore}
    transport = KillAfterSendTransport if point == "after-send" else KillAfterAnswerTransport
    return {"executor": functools.partial(ClickHouseSnapshotExecutor, transport_factory=transport)}


def main(argv: list[str] | None = None) -> int:
    """Publish one intent and die at the named point (exit 3 if the point was never hit)."""
    parser = argparse.ArgumentParser(prog="python -m tests.publication_harness")
    stops = tuple(f"stop-{step}" for step in STOP_STEPS)
    parser.add_argument("point", choices=(*CRASH_POINTS, *stops, "reconcile"))
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("intent")
    args = parser.parse_args(argv)
    config = PublicationConfig(args.data_dir, args.store)
    if args.point == "reconcile" or args.point.startswith("stop-"):
        return _answer_child(config, args.database, args.point, args.intent)
    publisher = build(config, args.database, **_crash_swaps(args.point)).publisher
    receipt = publisher.publish(args.intent)
    print(f"survived: {receipt.state.value}@{receipt.revision}", file=sys.stderr)
    return 3


def _answer_child(config: PublicationConfig, database: str, point: str, intent: str) -> int:
    swaps = {} if point == "reconcile" else _stop_swaps(point.removeprefix("stop-"))
    publisher = build(config, database, **swaps).publisher
    try:
        receipt = (publisher.reconcile if point == "reconcile" else publisher.publish)(intent)
    except DponeError as exc:
        print(exc.code)
        return 1
    print(f"{receipt.state.value}@{receipt.revision}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
