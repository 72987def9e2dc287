"""``ClickHouseValidatedFileService``: a validated file becomes a verified staging table.

It owns the attempt's sequence (``checking``, ``preparing``, ``prepared``,
``creating_staging``, ``loading``, ``verifying``, ``staged``), query ownership and
failure cleanup (``failed_cleaned``, ``retained_unknown`` or ``cleanup_failed``). A
durable journal intent (the port of :mod:`dpone.ports.attempt_journal`) precedes every
mutation, each with exactly one ``dpone-b02-<attempt>-<kind>`` query id, never retried;
the reads that prove the staging table the attempt's own are
:mod:`dpone.staging.table_checks`. See docs/staging.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_tables import (
    observe_ownership,
    ownership_comment,
    staging_table_name,
)
from dpone.connectors.endpoint_identity import (
    observe_identity,
    observe_principal,
    raise_if_database_missing,
)
from dpone.connectors.remote_termination import prove_termination
from dpone.contracts.receipt import FileReceipt
from dpone.errors import DeadlineError, DponeError, stopping_signals_held
from dpone.ports.attempt_journal import ClickHouseFileJournalResource
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import (
    check_attempt_id,
    mutation,
    mutation_query_id,
    read_query_id,
)
from dpone.ports.clickhouse_result import QueryResult
from dpone.preparation.artifact import FileVerificationBudget
from dpone.preparation.spool import (
    DEFAULT_MODE,
    PreparationBudget,
    PreparedSpool,
    prepare_rowbinary,
)
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact, FileAttempt
from dpone.sql import quote_identifier, quote_literal
from dpone.staging.cleanup import UNOBSERVABLE, CleanupRefused, drop_owned_table
from dpone.staging.contract import (
    PhysicalDesign,
    StagingError,
    StagingPolicy,
    check_receipt_versions,
    local_io_failed,
)
from dpone.staging.run import (
    SETTLED_ACKNOWLEDGED,
    SETTLED_NOT_SUBMITTED,
    AttemptRun,
    error_code,
    settlement,
)
from dpone.staging.states import StageState
from dpone.staging.table_checks import EndpointChanged, StagingTableChecks, qualified_name
from dpone.typepolicy import plan_columns

S = StageState
# check_types(columns): refuses (name, ClickHouse type) pairs the transport cannot send.
TypeCheck = Callable[[Sequence[tuple[str, str]]], None]
# journal_factory(policy, attempt_id): the journal of one attempt, its storage bound by
# the factory (production: dpone.staging.journal.file_journals(work_dir)).
JournalFactory = Callable[[StagingPolicy, str], ClickHouseFileJournalResource]


@dataclass(frozen=True)
class StagedTable:
    """The handle of a verified staging table; ``journal_head`` is the final event's SHA-256."""

    database: str
    table: str
    uuid: str
    rows: int
    semantic_id: str
    journal_path: Path
    journal_head: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    converter: str = ""  # which converter wrote the RowBinary (see PreparedSpool)


class ClickHouseValidatedFileService:
    """Stages one validated file per call through one controlled transport."""

    def __init__(
        self,
        transport: QueryPort,
        database: str,
        *,
        journal_factory: JournalFactory,
        policy: StagingPolicy | None = None,
        design: PhysicalDesign | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        progress: Callable[[str, int, int], None] | None = None,
        preparation_mode: str = DEFAULT_MODE,
        user: str | None = None,
        user_uuid: str | None = None,
        check_types: TypeCheck | None = None,
    ) -> None:
        self.transport = transport
        self.database = database
        self.policy = policy or StagingPolicy()
        self.design = design or PhysicalDesign()
        self.clock = clock
        self.wall_clock = wall_clock
        self.journal_factory = journal_factory
        # progress(phase, rows, bytes): for a terminal display; never part of the evidence.
        self.progress = progress
        self.preparation_mode = preparation_mode
        # The credentials' user (None: whoever the server says); its system.users id.
        self.user = user
        self.user_uuid = user_uuid
        self.check_types = check_types
        self._reads = 0

    # ------------------------------------------------------------------ the sequence

    def stage(
        self,
        artifact: ContractValidatedFileArtifact,
        attempt_id: str,
        *,
        overrides: dict[str, str] | None = None,
    ) -> StagedTable:
        """Run one attempt; return the staged table or raise with the last confirmed record."""
        check_attempt_id(attempt_id)
        journal = self.journal_factory(self.policy, attempt_id)
        try:
            journal.open()
            return self._attempt(journal, artifact, attempt_id, overrides)
        finally:
            journal.close()

    def _attempt(
        self,
        journal: ClickHouseFileJournalResource,
        artifact: ContractValidatedFileArtifact,
        attempt_id: str,
        overrides: dict[str, str] | None,
    ) -> StagedTable:
        table = staging_table_name(attempt_id)
        run = AttemptRun(
            journal,
            {
                "endpoint": self._endpoint_description(),
                "transport": self.transport.name,
                # Whether every write goes through a drain-gate session (the ingest
                # closure's proof rests on it), as the transport itself says.
                "drain_gate": getattr(self.transport, "drain_gate", False) is True,
                "planned_ownership": {"database": self.database, "table": table},
                "principal": {"user": self.user, "user_uuid": self.user_uuid},
            },
            wall_clock=self.wall_clock,
        )
        prep_deadline = self.clock() + self.policy.preparation_seconds
        budget = FileVerificationBudget(prep_deadline, self.policy.max_scan_bytes, self.clock)
        try:
            with contextlib.ExitStack() as stack:
                try:
                    self._preflight(run, prep_deadline)
                    attempt = stack.enter_context(
                        artifact.file_validation_attempt(attempt_id, verification_budget=budget)
                    )
                except BaseException as exc:
                    run.record_failure(S.FAILED_CLEANED, exc)  # nothing exists remotely
                    raise
                return self._stage(run, attempt, table, prep_deadline, overrides)
        except BaseException as exc:
            if isinstance(exc, DponeError) and run.last is not None:
                exc.add_details(last_event=run.last.document, journal=str(journal.attempt_dir))
            raise

    def _preflight(self, run: AttemptRun, deadline: float) -> None:
        """Before the file is even scanned: who we are and where we stage (reads only,
        except the one-time creation of a Nil-UUID server's identity)."""
        try:
            principal = observe_principal(
                self.transport,
                self.user,
                probe_prefix=self._read_id(run, "principal"),
                deadline=self._bounded(deadline),
            )
        except ClickHouseServerError as exc:
            raise_if_database_missing(
                exc,
                self.database,
                f"database {self.database!r} does not exist; create it with "
                f"CREATE DATABASE {quote_identifier(self.database)} ENGINE = Atomic",
            )
            raise
        if principal["user_uuid"] is None:
            principal["user_uuid"] = self.user_uuid
        run.base["principal"] = principal
        identity = observe_identity(
            self.transport,
            self.database,
            probe_prefix=self._read_id(run, "identity"),
            deadline=self._bounded(deadline),
            establish=lambda statement: self._mutate(run, S.CHECKING, "identity", statement),
        )
        run.base["endpoint_identity"] = identity.to_document()

    def _stage(
        self,
        run: AttemptRun,
        attempt: FileAttempt,
        table: str,
        prep_deadline: float,
        overrides: dict[str, str] | None,
    ) -> StagedTable:
        receipt = attempt.receipt
        run.event(S.CHECKING, "admitted", source_identity=receipt.to_document())
        try:
            self._check_receipt(receipt, overrides)
            run.move(S.PREPARING)
            prepared = prepare_rowbinary(
                attempt.held.path,
                receipt,
                run.journal.spool_dir,
                overrides=overrides,
                held=attempt.held,
                progress=partial(self._phase, "preparing"),
                mode=self.preparation_mode,
                budget=PreparationBudget(
                    max_record_bytes=self.policy.max_record_bytes,
                    max_rows=self.policy.max_rows,
                    max_spool_bytes=self.policy.max_spool_bytes,
                    free_space_reserve_bytes=self.policy.free_space_reserve_bytes,
                    deadline_seconds=max(prep_deadline - self.clock(), 0.0),
                    clock=self.clock,
                ),
            )
            run.prepared_spool(prepared)
            run.event(
                S.PREPARED,
                "prepared",
                derived_identity=prepared.identity.to_document(),
                semantic_id=prepared.semantic_id,
                converter=prepared.converter,
            )
            self._checks(run).absent(table, prep_deadline)
            self._check_deadline(prep_deadline, "pre-CREATE checks")
        except BaseException as exc:
            coded = local_io_failed(run.attempt_id, exc) if isinstance(exc, OSError) else exc
            self._fail_before_create(run, coded)
            if coded is exc:
                raise
            raise coded from exc
        try:
            return self._create_load_verify(run, attempt, prepared, table)
        except BaseException as exc:
            self._cleanup(run, table, exc)
            raise

    def _check_receipt(self, receipt: FileReceipt, overrides: dict[str, str] | None) -> None:
        """The receipt must describe the codec and policy this build reads and converts with."""
        check_receipt_versions(receipt)
        if self.check_types is not None:
            plans = plan_columns(receipt.schema.columns, overrides)
            self.check_types([(p.name, p.clickhouse_type) for p in plans])

    def _create_load_verify(
        self, run: AttemptRun, attempt: FileAttempt, prepared: PreparedSpool, table: str
    ) -> StagedTable:
        comment = ownership_comment(run.attempt_id, prepared.semantic_id)
        self._create(run, table, comment, prepared)
        rows = prepared.identity.prepared_rows
        self._load(run, table, prepared)
        # One verification deadline covers COUNT, metadata, identity scans and completion.
        verify_deadline = self.clock() + self.policy.verification_seconds
        insert_id = mutation_query_id(run.attempt_id, "insert") if rows else None
        run.event(
            S.VERIFYING,
            "acknowledged" if rows else "not_submitted_empty",
            query={"kind": "insert", "query_id": insert_id},
        )
        count = self._verify(run, attempt, table, comment, prepared, verify_deadline)
        run.release_spool()
        # The last check before the final event: once "staged" is durable it is the truth.
        self._check_deadline(verify_deadline, "return")
        final = run.event(
            S.STAGED,
            "staged",
            semantic_id=prepared.semantic_id,
            observed_ownership={"table_uuid": run.table_uuid},
        )
        return StagedTable(
            self.database,
            table,
            run.table_uuid or "",
            count,
            prepared.semantic_id,
            run.journal.attempt_dir,
            final.sha256,
            metadata={
                "validated_file_consumption": {
                    "record": final.document,
                    "journal": str(run.journal.attempt_dir),
                }
            },
            converter=prepared.converter,
        )

    def _create(self, run: AttemptRun, table: str, comment: str, prepared: PreparedSpool) -> None:
        # The ownership mark is the first column's comment: every client can send a
        # column COMMENT (Debian's clickhouse-client 18.16 cannot parse a table COMMENT).
        columns = ", ".join(
            f"{quote_identifier(c.name)} {c.clickhouse_type}"
            + (f" COMMENT {quote_literal(comment)}" if i == 0 else "")
            for i, c in enumerate(prepared.identity.target_schema)
        )
        run.table_created_maybe = True
        statement = f"CREATE TABLE {self._qualified(table)} ({columns}) {self.design.clause()}"
        self._mutate(run, S.CREATING_STAGING, "create", statement)
        verify_by = self.clock() + self.policy.verification_seconds
        schema = prepared.identity.target_schema
        run.table_uuid = self._checks(run).identity(table, comment, schema, verify_by)

    def _load(self, run: AttemptRun, table: str, prepared: PreparedSpool) -> None:
        identity = prepared.identity
        if identity.prepared_rows == 0:
            run.event(
                S.LOADING,
                "not_submitted_empty",
                query={"kind": "insert", "query_id": None},
                observed_ownership={"table_uuid": run.table_uuid},
            )
            return
        self._phase("loading", identity.prepared_rows, identity.rowbinary_bytes)
        result = self._mutate(
            run,
            S.LOADING,
            "insert",
            f"INSERT INTO {self._qualified(table)} FORMAT RowBinary",
            body=prepared.path,
            observed_ownership={"table_uuid": run.table_uuid},
        )
        if (result.sent_bytes, result.sent_sha256) != (
            identity.rowbinary_bytes,
            identity.rowbinary_sha256,
        ):
            raise StagingError(
                f"sent {result.sent_bytes} bytes with SHA-256 {result.sent_sha256}, prepared "
                f"{identity.rowbinary_bytes} with {identity.rowbinary_sha256}",
                code="sent_bytes_mismatch",
            )

    def _verify(
        self,
        run: AttemptRun,
        attempt: FileAttempt,
        table: str,
        comment: str,
        prepared: PreparedSpool,
        deadline: float,
    ) -> int:
        """Everything after the INSERT, under the verification deadline."""
        checks = self._checks(run)
        # The probes and descriptions in one identified request; the single COUNT in
        # its own (seed 001), asked once the identity held.
        reads = ("table", "columns", "stored_bytes")
        checks.prefetch("verify", table, reads, deadline, endpoint=True)
        # The endpoint first: elsewhere, a missing table would read as "never created".
        self._check_endpoint(run, deadline, "after the INSERT", checks)
        again = checks.identity(table, comment, prepared.identity.target_schema, deadline)
        if again != run.table_uuid:
            raise StagingError(
                f"staging table UUID changed from {run.table_uuid} to {again}",
                code="table_replaced",
            )
        rows = prepared.identity.prepared_rows
        count = checks.count(table, deadline)
        run.counts["observed_count"] = count
        if count != rows:
            raise StagingError(
                f"COUNT observed {count} rows, prepared {rows}",
                code="count_mismatch",
                observed=count,
            )
        checks.within_storage(table, self.policy.max_stored_bytes, deadline)
        # Completion re-scans the source: it belongs to this deadline, not preparation's.
        attempt.complete(
            count, FileVerificationBudget(deadline, self.policy.max_scan_bytes, self.clock)
        )
        self._check_deadline(deadline, "completion")
        return count

    def _check_endpoint(
        self, run: AttemptRun, deadline: float, when: str, checks: StagingTableChecks | None = None
    ) -> None:
        (checks or self._checks(run)).endpoint(
            run.base["endpoint_identity"],
            probe_prefix=self._read_id(run, "identity"),
            deadline=deadline,
            when=when,
        )

    def _phase(self, phase: str, rows: int, size: int) -> None:
        if self.progress is not None:
            self.progress(phase, rows, size)

    # ------------------------------------------------------------------ failure

    def _fail_before_create(self, run: AttemptRun, exc: BaseException) -> None:
        if run.state is not S.CHECKING:  # a spool may exist, sealed or refused
            self._release_spool(run, exc)
        run.record_failure(S.FAILED_CLEANED, exc)

    def _release_spool(self, run: AttemptRun, exc: BaseException) -> None:
        """On a failure path: remove the spool; if that fails, it stays listed."""
        try:
            run.release_spool()
        except DponeError as release:
            exc.add_note(f"the spool was kept: {release}")

    def _cleanup(self, run: AttemptRun, table: str, exc: BaseException) -> None:
        """After the CREATE intent: decide and record how the attempt ends; never raises."""
        if run.state is S.PREPARED:  # the CREATE intent was never recorded: nothing sent
            return self._fail_before_create(run, exc)
        ending_said = False
        try:
            run.event(S.CLEANUP, "started", error_code=error_code(exc))
            try:
                ending = self._clean(run, table, exc)
            except CleanupRefused as refused:
                exc.add_note(f"cleanup did not finish: {refused}")
                ending = S.CLEANUP_FAILED
            except UNOBSERVABLE as unobservable:
                # The server could not be asked, or did not answer exactly: its state is
                # unknown, never assumed; everything is kept.
                exc.add_note(f"remote state could not be observed: {unobservable}")
                ending = S.RETAINED_UNKNOWN
            if ending is S.FAILED_CLEANED and run.prepared is not None:
                self._release_spool(run, exc)
            ending_said = True  # a failed terminal record is not a failed cleanup
            run.terminal(ending, exc)
        except BaseException as cleanup_exc:
            exc.add_note(f"cleanup did not finish: {type(cleanup_exc).__name__}: {cleanup_exc}")
            if run.state is S.CLEANUP and not ending_said:
                run.record_failure(S.CLEANUP_FAILED, cleanup_exc, primary=exc)

    def _clean(self, run: AttemptRun, table: str, exc: BaseException) -> StageState:
        try:
            # Only the attempt's own server can prove a query ended or that nothing was
            # created: another server's query log, start time or tables say nothing.
            self._check_endpoint(run, self.clock() + self.policy.verification_seconds, "at cleanup")
        except EndpointChanged as changed:
            if not isinstance(exc, EndpointChanged):
                exc.add_note(str(changed))
            run.inventory["endpoint_changed"] = changed.details["after"]
            return S.RETAINED_UNKNOWN
        if not self._remote_settled(run, exc):
            return S.RETAINED_UNKNOWN
        found = observe_ownership(
            self.transport,
            self.database,
            table,
            lambda: self._read_id(run, "owned"),
            self.clock() + self.policy.verification_seconds,
        )
        if found is None:
            return S.FAILED_CLEANED  # nothing was created
        semantic = run.prepared.semantic_id if run.prepared else ""
        if not found.belongs_to(run.attempt_id, semantic, run.table_uuid):
            run.inventory["table_not_owned"] = table
            return S.RETAINED_UNKNOWN
        gone = drop_owned_table(
            self.transport,
            run,
            S.CLEANUP,
            kind="drop",
            database=self.database,
            table=table,
            found=found,
            request_seconds=self.policy.request_seconds,
            clock=self.clock,
            read_id=partial(self._read_id, run),
        )
        return S.FAILED_CLEANED if gone else S.RETAINED_UNKNOWN

    def _remote_settled(self, run: AttemptRun, exc: BaseException) -> bool:
        """True when every mutation sent so far is proven finished on the server."""
        query_id = run.in_flight
        if query_id is None:
            return True  # every mutation sent was settled; the failure was local
        how = settlement(exc)
        if how is not None:
            run.settle(query_id, how)
            return True  # the server answered with an exception, or nothing left
        state = prove_termination(
            self.transport,
            query_id,
            probe_prefix=self._read_id(run, "termination"),
            deadline=self.clock() + self.policy.verification_seconds,
            origin=run.origin(query_id),
        )
        if state.proven_terminal:
            run.settle(query_id, state.termination.value)
        run.event(
            S.CLEANUP,
            "termination_observed",
            remote={
                "query_id": query_id,
                "termination": state.termination.value,
                "source": state.source,
            },
        )
        return state.proven_terminal

    def _mutate(
        self,
        run: AttemptRun,
        state: StageState,
        kind: str,
        statement: str,
        body: Path | None = None,
        **intent_fields: Any,
    ) -> QueryResult:
        """A durable intent, then the one request under its own id; records how it settled."""
        query_id = mutation_query_id(run.attempt_id, kind)
        deadline = self.clock() + self.policy.request_seconds  # before the intent (its window)
        request = mutation(statement, query_id, body=body)
        if body is not None:
            # The wire carries the spool: its ceiling holds while the body streams too.
            request = dataclasses.replace(request, max_body_bytes=self.policy.max_spool_bytes)
        calling = False
        try:
            # A signal while the intent is written is raised once it is durable: its
            # request provably never left (not_submitted), no termination to prove.
            with stopping_signals_held():
                run.intent(state, kind, query_id, self.policy.request_seconds, **intent_fields)
            calling = True
            result = self.transport.execute(request, deadline=deadline)
        except BaseException as exc:
            if not calling:
                if run.in_flight == query_id:
                    run.settle(query_id, SETTLED_NOT_SUBMITTED)
                raise
            how = settlement(exc)
            if how is not None:
                run.settle(query_id, how)
            else:
                run.returned(query_id)  # the transport raised: nothing more is sent
            raise
        run.settle(query_id, SETTLED_ACKNOWLEDGED)
        return result

    # ------------------------------------------------------------------ helpers

    def _read_id(self, run: AttemptRun, purpose: str) -> str:
        self._reads += 1
        return read_query_id(run.attempt_id, purpose, self._reads)

    def _bounded(self, phase_deadline: float) -> float:
        return min(phase_deadline, self.clock() + self.policy.request_seconds)

    def _check_deadline(self, deadline: float, phase: str) -> None:
        if self.clock() >= deadline:
            expired = f"deadline expired during {phase}"
            raise DeadlineError(expired, code="phase_deadline", phase=phase)

    def _qualified(self, table: str) -> str:
        return qualified_name(self.database, table)

    def _checks(self, run: AttemptRun) -> StagingTableChecks:
        return StagingTableChecks(
            self.transport,
            self.database,
            self.design,
            read_id=partial(self._read_id, run),
            bounded=self._bounded,
        )

    def _endpoint_description(self) -> str:
        endpoint = getattr(self.transport, "endpoint", None)
        return endpoint.describe() if endpoint is not None else self.transport.name
