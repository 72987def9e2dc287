"""What a refresh checks before any work, and what it refuses with.

The ``check`` phase of :mod:`dpone.project.refresh`: one refresh of a table at a time
(:func:`table_lock`), the target database exists and is protected, no publication of
the slot awaits its outcome, the target has no side effect the publisher refuses, and
the source's columns are the target's or the table decided to replace its design
(:class:`RefreshChecks`). Each is refused with a coded :class:`RefreshError` (or the
publication's own error) before anything is exported.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.connectors.clickhouse_tables import (
    observe_ownership,
    ownership_comment,
    staging_table_name,
)
from dpone.contracts.composition_snapshot import SnapshotIntent
from dpone.durable_files import PRIVATE_FILE_MODE, private_directories
from dpone.errors import ConfigurationError, DponeError, StateError
from dpone.exporters.sources import open_source
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read, read_query_id
from dpone.ports.composition_snapshot import CatalogObservation, TargetSlot
from dpone.project.config import Project, TableConfig
from dpone.project.design_change import column_changes, describe_change
from dpone.project.table_run import REQUEST_SECONDS, publication_for, snapshot_command
from dpone.publication.catalog import ClickHouseSnapshotCatalog
from dpone.publication.composition import (
    PublicationComponents,
    check_ownership,
    claim_slots,
)
from dpone.publication.dispatch.postgres_locks import postgres_table_lock
from dpone.publication.principals.ownership import OwnedElsewhere
from dpone.publication.principals.pool_databases import (
    database_replaced,
    require_database,
    require_protected_database,
)
from dpone.publication.principals.pool_verify import verify_pool
from dpone.publication.publisher.rules import refuse_absent_writers, refuse_side_effects
from dpone.publication.settings import ungated_transport
from dpone.publication.sharing.run_sharing import RunSharing
from dpone.publication.store import StoreLocation, open_store, store_exists
from dpone.publication.store.postgres import is_store_url
from dpone.sql import quote_literal
from dpone.staging.sink import new_attempt_id
from dpone.typepolicy import plan_columns

OWNED_MARK = ownership_comment("", "").split(" ", 1)[0] + " "  # "dpone-owned "


class RefreshError(StateError):
    """A refresh step refused to go on (see ``code``: shrink_refused, design_unreadable)."""

    code = "refresh_failed"


class RefreshChecks:
    """The ``check`` phase's reads of one refresh (``design_change``: the run's choice
    over each table's own ``on_design_change``)."""

    def __init__(
        self,
        project: Project,
        design_change: str | None = None,
        cleared: frozenset[str] = frozenset(),
        sharing: RunSharing | None = None,
    ) -> None:
        self.project = project
        self.design_change = design_change
        self.sharing = sharing  # the run's, when its tables go in threads
        # Tables whose targets this run already found clear (:func:`catalog_cleared`).
        self.cleared = cleared
        # What the check built to observe the target, for the rest of the same run.
        self.parts: PublicationComponents | None = None

    def replaces(self, table: TableConfig) -> bool:
        """Whether this run publishes a new design rather than refuse it."""
        return (self.design_change or table.on_design_change) == "replace"

    def check(self, table: TableConfig, attempt_id: str) -> list[dict[str, Any]]:
        """Refuse what would refuse the run later; the decided design change (or [])."""
        owned = self._where_and_when(table)
        self._ownership(table, owned)
        observed = self._target(table, attempt_id)
        return self._design_change(table, attempt_id, observed)

    def _where_and_when(self, table: TableConfig) -> bool:
        """What would refuse the run later, refused now, before the export; whether the
        server already records this store as the owner of the pool and the table's slot.

        The server is a version dpone supports (``server_too_old``); the target
        database exists and the server protects it (``database_missing``,
        ``database_not_protected``: a pool user asked later would call a protected
        database missing); no publication of the slot waits for its outcome
        (``slot_blocked``, with the command that resolves it).
        """
        why = ungated_transport(self.project.clickhouse.transport, self.project.publication)
        if why is not None:  # refused before the export, not at prepare
            raise ConfigurationError(
                f"{self.project.path}: clickhouse.transport {why}", code="ingest_ungated"
            )
        access = self.project.clickhouse.access
        # Another store's pool or target is refused before anything signs in as the
        # pool's principals (a remote pool's verification does, as every one of them).
        try:
            owned = check_ownership(
                access,
                self.project.store,
                [TargetSlot(table.database, table.target)],
                project=self.project.path,
            )
        except OwnedElsewhere:
            raise
        except DponeError:
            if access.managed:
                raise
            # The server could not be read: the installation's check names why (TLS, a
            # refused sign-in) without signing in as the pool, as `dpone pool verify` does.
            self._installation(table)
            raise
        if not access.managed:
            self._installation(table)  # the version among the rest of the installation
        # The managed server's version, then the database exists, is Atomic and protected.
        require_protected_database(access, table.database, version=access.managed)
        if not store_exists(self.project.store):
            self._no_store_yet(table)
            return False  # no publication of the slot can be waiting, nothing is owned
        # Opened as the publication opens it: another table's refresh may be creating it
        # this very moment, and the store's own transaction settles who does.
        store = open_store(self.project.store)
        for summary in store.list_snapshots(TargetSlot(table.database, table.target)):
            if summary.blocking:
                # Its database dropped (and maybe created again): reconcile can prove
                # nothing there any more, abandon frees the target.
                recorded = SnapshotIntent.from_bytes(summary.intent_bytes).database_uuid
                dropped = database_replaced(access, table.database, recorded)
                verb = "abandon" if dropped else "reconcile"
                command = snapshot_command(self.project, verb, summary.intent_sha256)
                raise RefreshError(
                    f"{table.qualified_target} has a publication whose outcome is not yet "
                    f"known ({summary.state}, intent {summary.intent_sha256}); nothing is "
                    + (
                        f"exported until it is abandoned (its database {table.database} was "
                        f"dropped since): `{command}`"
                        if dropped
                        else f"exported until it is reconciled: `{command}`"
                    ),
                    code="slot_blocked",
                    intent_sha256=summary.intent_sha256,
                    state=summary.state,
                    next_command=command,
                )
        return owned

    def _installation(self, table: TableConfig) -> None:
        """On a remote server, the pool's installation as ``dpone pool verify`` proves it
        (exact grants, logins, database, identity), again at every run: its operator,
        not dpone, controls it. The first problem's code refuses the run, all are named.
        It holds the store's dispatch gate (see :func:`verify_pool`): another table's
        closure never counts its sign-ins as that lease's late queries."""
        found = verify_pool(self.project.clickhouse.access, [table.database], self.project.store)
        if found.ok:
            return
        command = shlex.join(["dpone", "pool", "verify", "--config", str(self.project.path)])
        first = found.problems[0]
        raise ConfigurationError(
            f"the pool installed on {found.server} is not what dpone needs: "
            + "; ".join(p["message"] for p in found.problems)
            + f" (`{command}` lists each problem)",
            code=str(first["code"]),
            problems=found.problems,
            next_command=command,
        )

    def _no_store_yet(self, table: TableConfig) -> None:
        """No store: refused (``store_missing``) when the target carries dpone's mark.

        Such a target was published with a store this project no longer points at; a
        new, empty store would not know its copies, leases or history. A target without
        the mark (the user's own table, replaced by a first publication) or none at all
        is a first refresh, which creates the store.
        """
        access = self.project.clickhouse.access
        admin = HttpTransport(access.endpoint(table.database), access.operator())
        reads = iter(range(1, 1_000))
        found = observe_ownership(
            admin,
            table.database,
            table.target,
            lambda: f"dpone-refresh-store-{time.time_ns()}-{next(reads)}",
            time.monotonic() + REQUEST_SECONDS,
        )
        # A published target is a former generation: it carries its attempt's mark.
        if found is not None and (found.comment or "").startswith(OWNED_MARK):
            raise ConfigurationError(
                f"{table.qualified_target} was published by dpone, but the store "
                f"{self.project.store} does not exist: point `store` in [project] at the "
                "store its refreshes used; a new, empty store would not know its copies, "
                "leases or history",
                code="store_missing",
                store=str(self.project.store),
                uuid=found.uuid,
            )

    def _ownership(self, table: TableConfig, owned: bool = False) -> None:
        """The server records this project's store as the owner of its pool and of the
        table's slot, or the run is refused (``pool_owned_elsewhere``,
        ``slot_owned_elsewhere``), before anything is leased, claimed or exported: two
        stores on one server would otherwise break each other's proofs.

        ``owned``: the check's read of the same markers found both this store's, and
        nothing this run does since makes, drops or changes a marker: a claim would
        read the same and create nothing, so it is not asked again.
        """
        if owned:
            return
        store = open_store(self.project.store)
        claim_slots(
            self.project.clickhouse.access,
            store,
            [TargetSlot(table.database, table.target)],
            project=self.project.path,
        )

    def writers(self, table: TableConfig) -> None:
        """What :meth:`check` refuses about the target's database, its owner, side
        effects and writers, alone (``dpone check``): raised as the refresh would raise
        it before its export, and read-only (no ownership marker is made)."""
        require_database(self.project.clickhouse.access, table.database)
        self._target(table, new_attempt_id(), read_only=True)

    def _target(
        self, table: TableConfig, attempt_id: str, *, read_only: bool = False
    ) -> CatalogObservation | None:
        """The target has no side effect the publisher refuses (a view or dictionary
        reading it, a Buffer or Distributed table writing it, a writer outside the
        leases...): refused now, as prepare would refuse it after the export. The
        observation that said so (None: the run's shared look found the target clear)."""
        slot = TargetSlot(table.database, table.target)
        if read_only:  # another store's pool or target, said without making a marker
            access = self.project.clickhouse.access
            check_ownership(access, self.project.store, [slot], project=self.project.path)
        # Not read-only: :meth:`_ownership` has just found (or made) the pool's marker
        # this store's, and the issuer need not read it again.
        parts = publication_for(
            self.project,
            table,
            claim_ownership=not read_only,
            sharing=self.sharing,
            pool_claimed=not read_only,
        )
        if not read_only:
            self.parts = parts
        if table.name in self.cleared:
            return None  # observed with the run's other tables of its database, and clear
        observation = parts.publisher.observe_settled(slot, staging_table_name(attempt_id))
        refuse_side_effects(observation)
        # The generation does not exist yet (nor, before a first publication, the
        # target): who could write it once created is refused now, not after the export.
        refuse_absent_writers(observation, table.database)
        return observation

    def _design_change(
        self, table: TableConfig, attempt_id: str, observed: CatalogObservation | None = None
    ) -> list[dict[str, Any]]:
        """The columns in which the source differs from the target, decided now.

        Empty when they agree, the target does not exist yet, or the source cannot be
        read here (the export then says why). Differing columns are refused
        (``design_changed``, column by column, before the export) unless the table's
        ``on_design_change`` (or this run's ``--design-change``) is ``replace``: the
        new design is then published through the same one EXCHANGE, and the old
        content stays as the rollback copy.

        The target's columns are those of ``observed``, the check's observation of the
        target just made (its design holds them as ``system.columns`` shows them, in
        their order); read here only when the check made none.
        """
        target = self._target_columns(table, attempt_id, observed)
        if not target:
            return []
        try:
            schema = open_source(self.project.sources[table.source]).schema(table.source_table)
            plans = plan_columns(schema.columns, dict(table.types) or None)
        except DponeError:
            return []  # the export reports the source's problem in its own phase
        changes = column_changes(target, [(p.name, p.clickhouse_type) for p in plans])
        if not changes:
            return []
        if not self.replaces(table):
            listed = "; ".join(describe_change(c) for c in changes)
            raise RefreshError(
                f"the source of {table.name} no longer matches {table.qualified_target}: "
                f"{listed}. Nothing was exported. To publish the new design (the current "
                f'content stays as the rollback copy), set on_design_change = "replace" in '
                f"[tables.{table.name}] or run with --design-change replace",
                code="design_changed",
                changes=changes,
            )
        return changes

    def _target_columns(
        self, table: TableConfig, attempt_id: str, observed: CatalogObservation | None
    ) -> list[tuple[str, str]]:
        """The target's columns (name, type) in their order; [] when it does not exist."""
        if observed is not None:
            design = observed.target.design if observed.target is not None else {"columns": []}
            return [(str(c["name"]), str(c["type"])) for c in design["columns"]]
        admin = HttpTransport(
            self.project.clickhouse.access.endpoint(table.database),
            self.project.clickhouse.access.operator(),
        )
        return [
            (str(r["name"]), str(r["type"]))
            for r in select_rows(
                admin,
                "SELECT name, type FROM system.columns WHERE "
                f"database = {literal(table.database)} AND table = {literal(table.target)} "
                "ORDER BY position",
                read_query_id(attempt_id, "refresh_columns", 1),
            )
        ]


def catalog_cleared(project: Project, tables: Sequence[TableConfig]) -> frozenset[str]:
    """The tables whose targets nothing would refuse now, observed for each database
    at once (:meth:`~dpone.publication.catalog.ClickHouseSnapshotCatalog.slots_blockers`:
    one request for them all, as many as there are tables).

    A run of several tables asks this once, before the first: each such table's
    ``check`` then does not observe its target again (prepare observes everything,
    fresh, before anything is published; a side effect that appears meanwhile is
    refused there). Any other table, or all of them when the store does not exist
    yet or the read fails, is checked on its own as a single table is: a blocker
    found here is refused by that table's own check, with its own error.
    """
    if len(tables) < 2 or not store_exists(project.store):
        return frozenset()
    try:  # another store's pool or slot is refused before anything signs in as the pool
        check_ownership(
            project.clickhouse.access,
            project.store,
            [TargetSlot(t.database, t.target) for t in tables],
            project=project.path,
        )
    except DponeError:
        return frozenset()  # each table's own check says why
    databases: dict[str, list[TableConfig]] = {}
    for table in tables:
        databases.setdefault(table.database, []).append(table)
    cleared: set[str] = set()
    for database, group in databases.items():
        if len(group) < 2:
            continue
        try:  # read-only: no ownership marker is made before the tables' own checks
            catalog = publication_for(project, group[0], claim_ownership=False).publisher.catalog
            if not isinstance(catalog, ClickHouseSnapshotCatalog):
                continue
            judged = catalog.slots_blockers(
                database, [(t.target, staging_table_name(new_attempt_id())) for t in group]
            )
        except DponeError:
            continue  # each table's own check reads and names it
        cleared |= {t.name for t in group if judged.get(t.target) == ()}
    return frozenset(cleared)


@contextmanager
def table_lock(work_dir: Path, name: str, store: StoreLocation | None = None) -> Iterator[None]:
    """One refresh of a table at a time, from its checks to its end.

    In a work dir (a file lock), and with a PostgreSQL ``store`` across every worker
    that shares it (an advisory lock there). Released when the process dies. A second
    refresh of the table is refused at once (``refresh_busy``, naming the holder),
    before it exports or stages anything.
    """
    if isinstance(store, str) and is_store_url(store):

        def busy(holder: str) -> RefreshError:
            return RefreshError(
                f"another refresh or rollback of {name} runs now ({holder}); run this one "
                "after it ends",
                code="refresh_busy",
                table=name,
                holder=holder,
            )

        with _work_dir_lock(work_dir, name), postgres_table_lock(store, name, busy):
            yield
        return
    with _work_dir_lock(work_dir, name):
        yield


@contextmanager
def _work_dir_lock(work_dir: Path, name: str) -> Iterator[None]:
    locks = work_dir / "locks"
    private_directories(locks)
    lock = locks / f"{name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise RefreshError(
                f"another refresh or rollback of {name} runs now in {work_dir}; run this one "
                "after it ends",
                code="refresh_busy",
                table=name,
                lock=str(lock),
            ) from exc
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def literal(value: str) -> str:
    """A SQL string literal."""
    return quote_literal(value)


def select_rows(transport: QueryPort, sql: str, query_id: str) -> list[dict[str, Any]]:
    """The rows of one read (JSONEachRow) within the run's request deadline."""
    deadline = time.monotonic() + REQUEST_SECONDS
    return transport.execute(
        read(f"{sql} FORMAT JSONEachRow", query_id), deadline=deadline
    ).json_rows()
