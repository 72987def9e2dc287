"""``ClickHouseValidatedFileService``: a validated file becomes a verified staging table.

It owns the attempt sequence, query ownership and failure cleanup:

    checking -> preparing -> prepared -> creating_staging -> loading -> verifying -> staged
    a failure before CREATE ends failed_cleaned; after it, cleanup decides:
    failed_cleaned (terminal query and verified removal), retained_unknown (local or
    remote state unknown: table, spool and journal are kept) or cleanup_failed.

A durable journal intent precedes every mutation; each mutation has exactly one
``dpone-b02-<attempt>-<create|insert|drop>`` query id and is never retried.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dpone.adapters.file_attempt_journal import ClickHouseFileAttemptJournal, JournalEvent
from dpone.connectors.clickhouse_errors import ClickHouseServerError, NotSubmitted
from dpone.connectors.clickhouse_request import (
    check_attempt_id,
    mutation,
    mutation_query_id,
    read,
    read_query_id,
)
from dpone.connectors.clickhouse_result import QueryResult
from dpone.connectors.endpoint_identity import NIL_UUID, observe_identity
from dpone.connectors.remote_termination import prove_termination
from dpone.errors import DeadlineError, DponeError, TransportError
from dpone.ports.clickhouse import QueryPort
from dpone.runtime.artifact import FileVerificationBudget
from dpone.runtime.clickhouse_file_stage_contract import (
    PhysicalDesign,
    StagingError,
    StagingPolicy,
)
from dpone.runtime.preparation import (
    MODE_PYTHON,
    PreparationBudget,
    PreparedSpool,
    prepare_rowbinary,
)
from dpone.runtime.staging_states import StageState, check_transition
from dpone.runtime.validated_file_artifact import ContractValidatedFileArtifact, FileAttempt
from dpone.sql import quote_identifier, quote_literal

S = StageState


@dataclass(frozen=True)
class StagedTable:
    """The handle of a verified staging table."""

    database: str
    table: str
    uuid: str
    rows: int
    semantic_id: str
    journal_path: Path
    metadata: dict[str, Any] = field(default_factory=dict)


def staging_table_name(attempt_id: str) -> str:
    """The private staging table of an attempt."""
    return "dpone_stage_" + "".join(c if c.isalnum() else "_" for c in attempt_id)


def ownership_comment(attempt_id: str, semantic_id: str) -> str:
    """The COMMENT that marks a table as created by this attempt."""
    return f"dpone-owned attempt={attempt_id} semantic={semantic_id}"


@dataclass(frozen=True)
class Ownership:
    """What the server shows about a staging table: its UUID and ownership mark."""

    uuid: str
    comment: str | None

    def belongs_to(self, attempt_id: str, semantic_id: str, table_uuid: str | None) -> bool:
        """True when the mark is the attempt's and the UUID is the one it observed (if any)."""
        return self.comment == ownership_comment(attempt_id, semantic_id) and (
            table_uuid is None or self.uuid == table_uuid
        )


def table_exists(
    transport: QueryPort, database: str, table: str, query_id: str, deadline: float
) -> bool:
    """Whether ``database.table`` exists now; anything but one exact count is an error."""
    rows = transport.execute(
        read(f"SELECT count() AS n FROM system.tables WHERE database = {quote_literal(database)} "
             f"AND name = {quote_literal(table)} FORMAT JSONEachRow", query_id),
        deadline=deadline,
    ).json_rows()  # fmt: skip
    if rows not in ([{"n": 0}], [{"n": 1}]):
        raise StagingError(
            f"existence of {database}.{table} is unobservable: {rows!r:.200}",
            code="table_unobservable",
        )
    return rows == [{"n": 1}]


def observe_ownership(
    transport: QueryPort, database: str, table: str, next_id: Callable[[], str], deadline: float
) -> Ownership | None:
    """The table's UUID and its first column's comment, or None when it does not exist."""
    where = f"database = {quote_literal(database)} AND "
    tables = transport.execute(
        read(f"SELECT toString(uuid) AS uuid FROM system.tables WHERE {where}name = {quote_literal(table)} "
             "FORMAT JSONEachRow", next_id()),
        deadline=deadline,
    ).json_rows()  # fmt: skip
    if not tables:
        return None
    columns = transport.execute(
        read(f"SELECT comment FROM system.columns WHERE {where}table = {quote_literal(table)} AND position = 1 "
             "FORMAT JSONEachRow", next_id()),
        deadline=deadline,
    ).json_rows()  # fmt: skip
    return Ownership(str(tables[0]["uuid"]), columns[0]["comment"] if columns else None)


class _Run:
    """The mutable state of one attempt, in one place."""

    def __init__(self, journal: ClickHouseFileAttemptJournal) -> None:
        self.journal = journal
        self.state = S.CHECKING
        self.last: JournalEvent | None = None
        self.base: dict[str, Any] = {}
        self.table_uuid: str | None = None
        self.table_created_maybe = False
        self.inventory: dict[str, Any] = {}
        self.prepared: PreparedSpool | None = None
        self.in_flight: str | None = None  # a mutation sent and not yet acknowledged


class ClickHouseValidatedFileService:
    """Stages one validated file per call through one controlled transport."""

    def __init__(
        self,
        transport: QueryPort,
        database: str,
        work_dir: str | Path,
        *,
        policy: StagingPolicy | None = None,
        design: PhysicalDesign | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal_factory: Callable[
            [Path, str], ClickHouseFileAttemptJournal
        ] = ClickHouseFileAttemptJournal,
        progress: Callable[[str, int, int], None] | None = None,
        preparation_mode: str = MODE_PYTHON,
    ) -> None:
        self.transport = transport
        self.database = database
        self.work_dir = Path(work_dir)
        self.policy = policy or StagingPolicy()
        self.design = design or PhysicalDesign()
        self.clock = clock
        self.journal_factory = journal_factory
        # progress(phase, rows, bytes): for a terminal display; never part of the evidence.
        self.progress = progress
        self.preparation_mode = preparation_mode
        self._reads = 0

    # ------------------------------------------------------------------ the sequence

    def stage(
        self, artifact: ContractValidatedFileArtifact, attempt_id: str, *,
        overrides: dict[str, str] | None = None,
    ) -> StagedTable:  # fmt: skip
        """Run one attempt; return the staged table or raise with the last confirmed record."""
        check_attempt_id(attempt_id)
        journal = self.journal_factory(self.work_dir, attempt_id)
        journal.open()
        run = _Run(journal)
        table = staging_table_name(attempt_id)
        run.base = {
            "endpoint": self._endpoint_description(),
            "transport": self.transport.name,
            "planned_ownership": {"database": self.database, "table": table},
        }
        prep_deadline = self.clock() + self.policy.preparation_seconds
        budget = FileVerificationBudget(prep_deadline, self.policy.max_scan_bytes, self.clock)
        try:
            with contextlib.ExitStack() as stack:
                try:
                    attempt = stack.enter_context(
                        artifact.file_validation_attempt(attempt_id, verification_budget=budget)
                    )
                except BaseException as exc:
                    self._terminal(run, S.FAILED_CLEANED, exc)  # admission failure: nothing exists
                    raise
                return self._stage(run, attempt, table, prep_deadline, overrides)
        except BaseException as exc:
            if isinstance(exc, DponeError) and run.last is not None:
                exc.add_details(last_event=run.last.document, journal=str(journal.attempt_dir))
            raise

    def _stage(
        self, run: _Run, attempt: FileAttempt, table: str, prep_deadline: float,
        overrides: dict[str, str] | None,
    ) -> StagedTable:  # fmt: skip
        receipt = attempt.receipt
        self._event(run, S.CHECKING, "admitted", source_identity=receipt.to_document())
        try:
            self._move(run, S.PREPARING)
            prepared = prepare_rowbinary(
                attempt.held.path, receipt, run.journal.attempt_dir / "spool",
                overrides=overrides, held=attempt.held, progress=partial(self._phase, "preparing"),
                mode=self.preparation_mode,
                budget=PreparationBudget(
                    max_record_bytes=self.policy.max_record_bytes, max_rows=self.policy.max_rows,
                    max_spool_bytes=self.policy.max_spool_bytes,
                    free_space_reserve_bytes=self.policy.free_space_reserve_bytes,
                    deadline_seconds=max(prep_deadline - self.clock(), 0.0), clock=self.clock,
                ),
            )  # fmt: skip
            run.prepared = prepared
            run.inventory["spool"] = str(prepared.path)
            self._event(run, S.PREPARED, "prepared", derived_identity=prepared.identity.to_document(),
                        semantic_id=prepared.semantic_id, counts={"prepared_rows": prepared.identity.prepared_rows,
                                                                  "observed_count": None})  # fmt: skip
            identity = observe_identity(self.transport, self.database, probe_prefix=self._read_id(run, "identity"),
                                        deadline=self._bounded(prep_deadline))  # fmt: skip
            run.base["endpoint_identity"] = identity.to_document()
            self._absent_before_create(run, table, prep_deadline)
            self._check_deadline(prep_deadline, "pre-CREATE checks")
        except BaseException as exc:
            self._fail_before_create(run, exc)
            raise
        try:
            return self._create_load_verify(run, attempt, prepared, table)
        except BaseException as exc:
            self._cleanup(run, table, exc)
            raise

    def _create_load_verify(
        self, run: _Run, attempt: FileAttempt, prepared: PreparedSpool, table: str
    ) -> StagedTable:
        create_id = mutation_query_id(run.journal.attempt_id, "create")
        comment = ownership_comment(run.journal.attempt_id, prepared.semantic_id)
        self._event(
            run, S.CREATING_STAGING, "intent", query={"kind": "create", "query_id": create_id}
        )
        # The ownership mark is the first column's comment: every client can send a
        # column COMMENT (Debian's clickhouse-client 18.16 cannot parse a table COMMENT).
        columns = ", ".join(
            f"{quote_identifier(c.name)} {c.clickhouse_type}"
            + (f" COMMENT {quote_literal(comment)}" if i == 0 else "")
            for i, c in enumerate(prepared.identity.target_schema)
        )
        run.table_created_maybe = True
        self._mutate(
            run,
            f"CREATE TABLE {self._qualified(table)} ({columns}) {self.design.clause()}",
            create_id,
        )
        run.table_uuid = self._verify_table(
            run, table, comment, prepared, self.clock() + self.policy.verification_seconds
        )
        rows = prepared.identity.prepared_rows
        insert_id = mutation_query_id(run.journal.attempt_id, "insert")
        if rows == 0:
            self._event(run, S.LOADING, "not_submitted_empty", query={"kind": "insert", "query_id": None},
                        observed_ownership={"table_uuid": run.table_uuid})  # fmt: skip
        else:
            self._event(run, S.LOADING, "intent", query={"kind": "insert", "query_id": insert_id},
                        observed_ownership={"table_uuid": run.table_uuid})  # fmt: skip
            self._phase("loading", rows, prepared.identity.rowbinary_bytes)
            result = self._mutate(
                run,
                f"INSERT INTO {self._qualified(table)} FORMAT RowBinary",
                insert_id,
                body=prepared.path,
            )
            if (result.sent_bytes, result.sent_sha256) != (
                prepared.identity.rowbinary_bytes,
                prepared.identity.rowbinary_sha256,
            ):
                raise StagingError(
                    f"sent {result.sent_bytes} bytes with SHA-256 {result.sent_sha256}, prepared "
                    f"{prepared.identity.rowbinary_bytes} with {prepared.identity.rowbinary_sha256}",
                    code="sent_bytes_mismatch",
                )
        # One verification deadline covers COUNT, metadata, identity scans and completion.
        verify_deadline = self.clock() + self.policy.verification_seconds
        self._event(run, S.VERIFYING, "acknowledged" if rows else "not_submitted_empty",
                    query={"kind": "insert", "query_id": insert_id if rows else None})  # fmt: skip
        again = self._verify_table(run, table, comment, prepared, verify_deadline)
        if again != run.table_uuid:
            raise StagingError(
                f"staging table UUID changed from {run.table_uuid} to {again}",
                code="table_replaced",
            )
        count = self._count(run, table, verify_deadline)
        if count != rows:
            raise StagingError(
                f"COUNT observed {count} rows, prepared {rows}",
                code="count_mismatch",
                observed=count,
            )
        attempt.complete(count)
        self._check_deadline(verify_deadline, "completion")
        shutil.rmtree(prepared.path.parent)
        run.inventory.pop("spool", None)
        # The last check before the final event: once "staged" is durable it is the truth.
        self._check_deadline(verify_deadline, "return")
        final = self._event(run, S.STAGED, "staged", semantic_id=prepared.semantic_id,
                            counts={"prepared_rows": rows, "observed_count": count},
                            observed_ownership={"table_uuid": run.table_uuid})  # fmt: skip
        return StagedTable(
            self.database,
            table,
            run.table_uuid or "",
            count,
            prepared.semantic_id,
            run.journal.attempt_dir,
            metadata={
                "validated_file_consumption": {
                    "record": final.document,
                    "journal": str(run.journal.attempt_dir),
                }
            },
        )

    def _phase(self, phase: str, rows: int, size: int) -> None:
        if self.progress is not None:
            self.progress(phase, rows, size)

    # ------------------------------------------------------------------ checks

    def _verify_table(
        self, run: _Run, table: str, comment: str, prepared: PreparedSpool, deadline: float
    ) -> str:
        rows = self.transport.execute(
            read("SELECT toString(uuid) AS uuid, engine, is_temporary, sorting_key, partition_key "
                 f"FROM system.tables WHERE database = {quote_literal(self.database)} AND name = {quote_literal(table)} "
                 "FORMAT JSONEachRow", self._read_id(run, "table")),
            deadline=self._bounded(deadline),
        ).json_rows()  # fmt: skip
        if len(rows) != 1:
            raise StagingError(
                f"staging table {table} observed {len(rows)} times", code="table_missing"
            )
        t = rows[0]
        problems = []
        if t["uuid"] in ("", NIL_UUID):
            problems.append("Nil table UUID")
        if t["engine"] != self.design.engine:
            problems.append(f"engine {t['engine']}")
        if t["is_temporary"] not in (0, False):
            problems.append("temporary table")
        if (
            t["sorting_key"] != self.design.expected_sorting_key
            or t["partition_key"] != self.design.expected_partition_key
        ):
            problems.append("physical design differs")
        cols = self.transport.execute(
            read("SELECT name, type, comment FROM system.columns "
                 f"WHERE database = {quote_literal(self.database)} AND table = {quote_literal(table)} "
                 "ORDER BY position FORMAT JSONEachRow", self._read_id(run, "columns")),
            deadline=self._bounded(deadline),
        ).json_rows()  # fmt: skip
        expected = [
            {"name": c.name, "type": c.clickhouse_type} for c in prepared.identity.target_schema
        ]
        if [{"name": c["name"], "type": c["type"]} for c in cols] != expected:
            problems.append("columns differ from the prepared schema")
        if not cols or cols[0]["comment"] != comment:
            problems.append("ownership comment differs")
        if problems:
            raise StagingError(f"staging table {table} fails its identity check: {'; '.join(problems)}",
                               code="table_identity_mismatch", problems=problems)  # fmt: skip
        return str(t["uuid"])

    def _count(self, run: _Run, table: str, deadline: float) -> int:
        rows = self.transport.execute(
            read(
                f"SELECT count() AS n FROM {self._qualified(table)} FORMAT JSONEachRow",
                self._read_id(run, "count"),
            ),
            deadline=self._bounded(deadline),
        ).json_rows()
        if len(rows) != 1 or set(rows[0]) != {"n"}:
            raise StagingError(
                f"COUNT returned {len(rows)} rows {rows!r:.200}", code="count_unobservable"
            )
        value = rows[0]["n"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise StagingError(
                f"COUNT returned a {type(value).__name__}, not an integer",
                code="count_unobservable",
            )
        return value

    def _absent_before_create(self, run: _Run, table: str, deadline: float) -> None:
        if table_exists(
            self.transport,
            self.database,
            table,
            self._read_id(run, "absent"),
            self._bounded(deadline),
        ):
            raise StagingError(
                f"staging table {table} already exists; it is not this attempt's",
                code="table_exists",
            )

    # ------------------------------------------------------------------ failure

    def _fail_before_create(self, run: _Run, exc: BaseException) -> None:
        if run.prepared is not None:
            shutil.rmtree(run.prepared.path.parent, ignore_errors=True)
            run.inventory.pop("spool", None)
        self._terminal(run, S.FAILED_CLEANED, exc)

    def _cleanup(self, run: _Run, table: str, exc: BaseException) -> None:
        try:
            self._move(run, S.CLEANUP)
            self._event(run, S.CLEANUP, "started", error_code=_code(exc))
            try:
                dropped = (
                    self._drop_if_owned(run, table) if self._remote_settled(run, exc) else None
                )
            except TransportError as unreachable:
                if isinstance(unreachable, ClickHouseServerError):
                    raise  # the server refused a cleanup step: verified cleanup cannot finish
                # The server cannot be asked: its state is unknown, never assumed.
                exc.add_note(f"remote state could not be observed: {unreachable}")
                dropped = None
            if dropped is None:
                self._terminal(run, S.RETAINED_UNKNOWN, exc)
                return
            if run.prepared is not None:
                shutil.rmtree(run.prepared.path.parent, ignore_errors=True)
                run.inventory.pop("spool", None)
            self._terminal(run, S.FAILED_CLEANED, exc)
        except BaseException as cleanup_exc:
            exc.add_note(f"cleanup did not finish: {type(cleanup_exc).__name__}: {cleanup_exc}")
            try:
                if run.state is S.CLEANUP:
                    self._terminal(run, S.CLEANUP_FAILED, cleanup_exc)
            except BaseException as journal_exc:
                exc.add_note(f"the failure record could not be published: {journal_exc}")

    def _remote_settled(self, run: _Run, exc: BaseException) -> bool:
        """True when every mutation sent so far is proven finished on the server."""
        query_id = run.in_flight
        if query_id is None:
            return True  # every mutation sent was acknowledged; the failure was local
        if isinstance(exc, ClickHouseServerError | NotSubmitted):
            return True  # the server answered with an exception, or nothing left
        state = prove_termination(self.transport, query_id, probe_prefix=self._read_id(run, "termination"),
                                  deadline=self.clock() + self.policy.verification_seconds)  # fmt: skip
        self._event(run, S.CLEANUP, "termination_observed",
                    remote={"query_id": query_id, "termination": state.termination.value, "source": state.source})  # fmt: skip
        return state.proven_terminal

    def _mutate(
        self, run: _Run, statement: str, query_id: str, body: Path | None = None
    ) -> QueryResult:
        run.in_flight = query_id
        result = self.transport.execute(mutation(statement, query_id, body=body),
                                        deadline=self.clock() + self.policy.request_seconds)  # fmt: skip
        run.in_flight = None
        return result

    def _drop_if_owned(self, run: _Run, table: str) -> bool | None:
        """Drop the staging table if it is ours; None when ownership cannot be settled."""
        found = observe_ownership(self.transport, self.database, table, lambda: self._read_id(run, "owned"),
                                  self.clock() + self.policy.verification_seconds)  # fmt: skip
        if found is None:
            return False  # nothing was created
        semantic = run.prepared.semantic_id if run.prepared else ""
        if not found.belongs_to(run.journal.attempt_id, semantic, run.table_uuid):
            run.inventory["table_not_owned"] = table
            return None
        drop_id = mutation_query_id(run.journal.attempt_id, "drop")
        self._event(run, S.CLEANUP, "drop_intent", query={"kind": "drop", "query_id": drop_id},
                    observed_ownership={"table_uuid": found.uuid})  # fmt: skip
        try:
            self._mutate(run, f"DROP TABLE {self._qualified(table)}", drop_id)
        except ClickHouseServerError:
            raise
        except DponeError:
            state = prove_termination(self.transport, drop_id, probe_prefix=self._read_id(run, "termination"),
                                      deadline=self.clock() + self.policy.verification_seconds)  # fmt: skip
            if not state.proven_terminal:
                return None
        if table_exists(self.transport, self.database, table, self._read_id(run, "dropped"),
                        self.clock() + self.policy.verification_seconds):  # fmt: skip
            raise StagingError(
                f"staging table {table} still exists after DROP", code="drop_unverified"
            )
        return True

    # ------------------------------------------------------------------ journal

    def _move(self, run: _Run, target: StageState) -> None:
        run.state = check_transition(run.state, target)

    def _event(self, run: _Run, state: StageState, outcome: str, **fields: Any) -> JournalEvent:
        if state is not run.state:
            self._move(run, state)
        document = {**run.base, "state": state.value, "outcome": outcome,
                    "cleanup_inventory": dict(run.inventory), **fields}  # fmt: skip
        run.last = run.journal.record(document)
        return run.last

    def _terminal(self, run: _Run, state: StageState, exc: BaseException) -> None:
        if state is S.RETAINED_UNKNOWN and run.table_created_maybe:
            run.inventory["table"] = run.base["planned_ownership"]
        self._event(run, state, "terminal", error_code=_code(exc))

    # ------------------------------------------------------------------ helpers

    def _read_id(self, run: _Run, purpose: str) -> str:
        self._reads += 1
        return read_query_id(run.journal.attempt_id, purpose, self._reads)

    def _bounded(self, phase_deadline: float) -> float:
        return min(phase_deadline, self.clock() + self.policy.request_seconds)

    def _check_deadline(self, deadline: float, phase: str) -> None:
        if self.clock() >= deadline:
            raise DeadlineError(
                f"deadline expired during {phase}", code="phase_deadline", phase=phase
            )

    def _qualified(self, table: str) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(table)}"

    def _endpoint_description(self) -> str:
        endpoint = getattr(self.transport, "endpoint", None)
        return endpoint.describe() if endpoint is not None else self.transport.name


def _code(exc: BaseException) -> str:
    return exc.code if isinstance(exc, DponeError) else type(exc).__name__
