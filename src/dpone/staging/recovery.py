"""Finding attempts that need an operator, their verified cleanup, and discarding staged tables.

An attempt needs an operator when its journal ends ``retained_unknown`` or
``cleanup_failed``, or without a terminal state. Cleanup settles every mutation the
journal shows as sent, from a later event or a proof now (``KILL QUERY ... SYNC``, the
query log of the mutation's own origin, or a server started after its dispatch window
closed), and drops only a table proven the attempt's own; discarding a staged table
that will never be published is the same, under its own ``-discard`` query id. A
refusal writes nothing; a journal without events is archived instead
(:mod:`dpone.staging.leftovers`); every operation first checks the endpoint the journal
bound (``endpoint_mismatch``). See docs/staging.md ("Operator recovery").
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.connectors.clickhouse_tables import Ownership, observe_ownership
from dpone.connectors.endpoint_identity import observe_server_start
from dpone.connectors.remote_termination import prove_termination
from dpone.errors import DponeError, StateError
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import mutation_query_id, read_query_id
from dpone.staging.cleanup import (
    UNOBSERVABLE,
    CleanupRefused,
    check_bound_endpoint,
    drop_owned_table,
)
from dpone.staging.journal import (
    ClickHouseFileAttemptJournal,
    JournalEvent,
    pending_publication,
    read_events,
)
from dpone.staging.leftovers import NO_EVENTS as NO_EVENTS
from dpone.staging.leftovers import attempt_directory as attempt_directory
from dpone.staging.leftovers import finishing_command as finishing_command
from dpone.staging.leftovers import left_behind as left_behind
from dpone.staging.leftovers import refuse_empty_journal
from dpone.staging.run import AttemptRun, dispatch_origin
from dpone.staging.states import NEEDS_OPERATOR, TERMINAL, StageState

RECOVERY_STEPS = (
    "prove the exact query's terminal state (its acknowledgment in the journal, a server "
    "start after its dispatch window, KILL QUERY WHERE query_id = ... SYNC, or system.query_log)",
    "verify the staging table's ownership (its UUID and first-column comment) before any DROP",
    "archive the attempt directory (journal and spool)",
    "start a fresh attempt with a new attempt id",
)
_PROVEN = frozenset({"finished_ok", "failed", "killed", "server_restart"})


@dataclass(frozen=True)
class SentMutation:
    """One mutation the journal shows as sent: its id, kind, dispatch window and intent."""

    query_id: str
    kind: str
    not_after_ms: int | None  # wall time after which it can no longer have been sent
    # The intent event: its principal, planned database and window (dispatch_origin).
    intent: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    returned_ms: int | None = None  # when the sending call returned unsettled, if recorded

    @property
    def window_closed_ms(self) -> int | None:
        """The wall time after which no byte of it was sent (None: unknown)."""
        ends = [t for t in (self.not_after_ms, self.returned_ms) if type(t) is int]
        return min(ends) if ends else None


@dataclass(frozen=True)
class AttemptSummary:
    """What an operator needs to know about one attempt."""

    attempt_id: str
    path: Path
    state: str
    last_sequence: int
    last_sha256: str | None
    sent: tuple[SentMutation, ...]
    settled: frozenset[str]
    planned_table: dict[str, Any] | None
    table_uuid: str | None
    semantic_id: str | None
    error_code: str | None
    inventory: dict[str, Any]
    # A retention drop's journal names the rollback copy (uuid, mark) it drops instead
    # of a table of its own (see dpone.project.retention).
    rollback_copy: dict[str, Any] | None = None
    # The server and database the attempt worked on, as its journal bound them (None:
    # its events record none, e.g. a retention drop's).
    endpoint_identity: dict[str, Any] | None = None
    # A publication after the last event that its writer never confirmed (see
    # ``pending_publication``): not an event, so not the attempt's state.
    unconfirmed: dict[str, Any] | None = None

    @property
    def sent_mutations(self) -> tuple[str, ...]:
        return tuple(m.query_id for m in self.sent)

    @property
    def unsettled(self) -> tuple[SentMutation, ...]:
        """Sent mutations whose end no event records: each needs a proof before a DROP."""
        return tuple(m for m in self.sent if m.query_id not in self.settled)

    @property
    def needs_operator(self) -> bool:
        return self.state not in {s.value for s in TERMINAL} or self.state in {
            s.value for s in NEEDS_OPERATOR
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "path": str(self.path),
            "state": self.state,
            "last_sequence": self.last_sequence,
            "last_sha256": self.last_sha256,
            "sent_mutations": list(self.sent_mutations),
            "unsettled_mutations": [m.query_id for m in self.unsettled],
            "planned_table": self.planned_table,
            "table_uuid": self.table_uuid,
            "semantic_id": self.semantic_id,
            "error_code": self.error_code,
            "inventory": self.inventory,
            "endpoint_identity": self.endpoint_identity,
            "unconfirmed_publication": self.unconfirmed,
            "needs_operator": self.needs_operator,
            "recovery_steps": list(RECOVERY_STEPS) if self.needs_operator else [],
        }


def summarize(attempt_dir: Path, events: list[JournalEvent]) -> AttemptSummary:
    """Condense a verified journal."""
    sent: list[SentMutation] = []
    settled: set[str] = set()
    returned: dict[str, int] = {}
    uuid = semantic = planned = copy = bound = None
    for event in events:
        doc = event.document
        back = doc.get("returned")
        if isinstance(back, dict) and type(back.get("at_ms")) is int:
            returned[str(back.get("query_id"))] = back["at_ms"]
        query = doc.get("query")
        if (
            isinstance(query, dict)
            and query.get("query_id")
            and doc.get("outcome") in ("intent", "drop_intent")
        ):
            window = doc.get("dispatch") or {}
            sent.append(
                SentMutation(
                    str(query["query_id"]),
                    str(query.get("kind")),
                    window.get("not_after_ms"),
                    intent=doc,
                )
            )
        if isinstance(doc.get("settled"), dict):
            settled.add(str(doc["settled"]["query_id"]))
        remote = doc.get("remote")
        if isinstance(remote, dict) and remote.get("termination") in _PROVEN:
            settled.add(str(remote["query_id"]))
        uuid = (doc.get("observed_ownership") or {}).get("table_uuid") or uuid
        semantic = doc.get("semantic_id", semantic)
        planned = doc.get("planned_ownership", planned)
        copy = doc.get("rollback_copy", copy)
        if isinstance(doc.get("endpoint_identity"), dict):
            bound = doc["endpoint_identity"]
    sent = [dataclasses.replace(m, returned_ms=returned.get(m.query_id)) for m in sent]
    last = events[-1] if events else None
    doc = last.document if last else {}
    return AttemptSummary(
        attempt_id=str(doc.get("attempt_id", attempt_dir.name)),
        path=attempt_dir,
        state=str(doc.get("state", NO_EVENTS)),
        last_sequence=last.sequence if last else 0,
        last_sha256=last.sha256 if last else None,
        sent=tuple(sent),
        settled=frozenset(settled),
        planned_table=planned,
        table_uuid=uuid,
        semantic_id=semantic,
        error_code=doc.get("error_code"),
        inventory=dict(doc.get("cleanup_inventory") or {}),
        rollback_copy=copy if isinstance(copy, dict) else None,
        endpoint_identity=bound,
        unconfirmed=pending_publication(attempt_dir, events),
    )


def list_attempts(work_dir: Path) -> list[AttemptSummary]:
    """Every attempt under ``work_dir`` (journals that do not verify raise)."""
    found, unreadable = survey_attempts(work_dir)
    if unreadable:
        raise unreadable[0].error
    return found


@dataclass(frozen=True)
class UnreadableAttempt:
    """An attempt directory whose journal does not verify (or cannot be read)."""

    path: Path
    error: DponeError

    def to_dict(self) -> dict[str, Any]:
        return {"attempt_id": self.path.name, "path": str(self.path), "error": self.error.to_dict()}


def survey_attempts(work_dir: Path) -> tuple[list[AttemptSummary], list[UnreadableAttempt]]:
    """Every attempt under ``work_dir``, and apart those whose journal cannot be read.

    One corrupt journal does not hide the others: each is read on its own.
    """
    found: list[AttemptSummary] = []
    unreadable: list[UnreadableAttempt] = []
    if not work_dir.is_dir():
        return found, unreadable
    for attempt_dir in sorted(work_dir.iterdir()):
        if not (attempt_dir / "events").is_dir():
            continue
        try:
            found.append(summarize(attempt_dir, read_events(attempt_dir)))
        except DponeError as exc:
            unreadable.append(UnreadableAttempt(attempt_dir, exc))
        except OSError as exc:
            error = StateError(
                f"the journal {attempt_dir} cannot be read: {exc.strerror or exc}",
                code="journal_unreadable",
                path=str(attempt_dir),
            )
            error.__cause__ = exc
            unreadable.append(UnreadableAttempt(attempt_dir, error))
    return found, unreadable


class _Operator:
    """One later actor on one attempt: its transport, deadline and read ids."""

    def __init__(
        self,
        transport: QueryPort,
        work_dir: Path,
        attempt_id: str,
        seconds: float,
        wall_clock: Callable[[], float],
    ) -> None:
        self.transport = transport
        self.attempt_dir = attempt_directory(work_dir, attempt_id)
        if (self.attempt_dir / "events").is_dir():
            refuse_empty_journal(
                self.attempt_dir,
                attempt_id,
                str(finishing_command(NO_EVENTS, attempt_id, work_dir, "")),
            )
        self.journal = ClickHouseFileAttemptJournal(work_dir, attempt_id)
        self.run = AttemptRun.resume(self.journal, wall_clock=wall_clock)
        self.summary = summarize(self.attempt_dir, read_events(self.attempt_dir))
        if self.summary.attempt_id != attempt_id:
            # A renamed directory: events appended under this name would break its journal.
            raise StateError(
                f"{self.attempt_dir} holds the journal of attempt {self.summary.attempt_id}, "
                f"not {attempt_id}; nothing done",
                code="attempt_id_mismatch",
                journal_attempt_id=self.summary.attempt_id,
            )
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.wall_clock = wall_clock
        self._reads = 0

    def read_id(self, purpose: str) -> str:
        self._reads += 1
        return read_query_id(self.summary.attempt_id, f"recovery_{purpose}", self._reads)

    def table(self, database: str | None) -> tuple[str, str] | None:
        planned = self.summary.planned_table
        if planned is None:
            return None
        if database is not None and planned["database"] != database:
            raise StateError(
                f"attempt {self.summary.attempt_id} staged into {planned['database']}, not {database}",
                code="database_mismatch",
            )
        return str(planned["database"]), str(planned["table"])

    def check_endpoint(self) -> None:
        """The first query of every operation: the endpoint is the one the journal bound.

        A journal that binds none (a retention drop's) is bound from here on to the
        identity observed: the events this operation appends record it.
        """
        planned = self.summary.planned_table or {}
        observed = check_bound_endpoint(
            self.transport,
            self.summary.endpoint_identity,
            str((self.summary.endpoint_identity or planned).get("database")),
            attempt_id=self.summary.attempt_id,
            probe_prefix=self.read_id("identity"),
            deadline=self.deadline,
        )
        self.run.base.setdefault("endpoint_identity", observed)

    def ownership(self, database: str, table: str, expected_uuid: str | None) -> Ownership | None:
        """The table if it exists and is provably the attempt's; refuses otherwise."""
        found = observe_ownership(
            self.transport, database, table, lambda: self.read_id("owned"), self.deadline
        )
        if found is None:
            return None
        s = self.summary
        if s.rollback_copy is not None:  # a retention drop: the copy keeps its creator's mark
            owned = found.uuid == s.rollback_copy.get("uuid") and (found.comment or "") == (
                s.rollback_copy.get("comment") or ""
            )
        else:
            owned = found.belongs_to(s.attempt_id, s.semantic_id or "", s.table_uuid)
        if not owned or (expected_uuid is not None and found.uuid != expected_uuid):
            raise StateError(
                f"{database}.{table} is not proven to be attempt {s.attempt_id}'s; not dropped",
                code="ownership_unverified",
                table_uuid=found.uuid,
            )
        return found

    def prove_settled(self) -> list[dict[str, Any]]:
        """A proof for every unsettled mutation (reads only); refuses at the first without."""
        proofs: list[dict[str, Any]] = []
        started: float | None = None
        for sent in self.summary.unsettled:
            closed = sent.window_closed_ms
            if closed is not None:
                if started is None:
                    started = observe_server_start(
                        self.transport,
                        query_id=self.read_id("uptime"),
                        deadline=self.deadline,
                        wall_clock=self.wall_clock,
                    )
                if started * 1000 > closed:
                    proofs.append(
                        {
                            "query_id": sent.query_id,
                            "termination": "server_restart",
                            "source": "uptime",
                            "server_started_after_ms": math.floor(started * 1000),
                            "window_closed_ms": closed,
                            "window_closed_by": "deadline"
                            if closed == sent.not_after_ms
                            else "returned",
                        }
                    )
                    continue
            origin = dispatch_origin(sent.intent, self.wall_clock())
            state = prove_termination(
                self.transport,
                sent.query_id,
                probe_prefix=self.read_id("termination"),
                deadline=self.deadline,
                origin=origin,
            )
            if not state.proven_terminal:
                raise StateError(
                    f"query {sent.query_id} of attempt {self.summary.attempt_id} has no proven terminal "
                    "state (no acknowledgment in the journal, the server has run since before its "
                    "dispatch window closed, and neither KILL QUERY nor the query log knows it as sent "
                    f"by {origin.user} in {origin.database} within its dispatch window); nothing done",
                    code="termination_unproven",
                    query_id=sent.query_id,
                )
            proofs.append(
                {
                    "query_id": sent.query_id,
                    "termination": state.termination.value,
                    "source": state.source,
                }
            )
        return proofs

    def drop(
        self, state: StageState, kind: str, database: str, table: str, found: Ownership
    ) -> bool:
        return drop_owned_table(
            self.transport,
            self.run,
            state,
            kind=kind,
            database=database,
            table=table,
            found=found,
            request_seconds=self.seconds,
            clock=time.monotonic,
            read_id=self.read_id,
        )


def cleanup_attempt(
    transport: QueryPort,
    work_dir: Path,
    attempt_id: str,
    *,
    seconds: float = 120.0,
    database: str | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> AttemptSummary:
    """Verified cleanup of an attempt that needs an operator; refuses without proof.

    Every check is made before anything is written: a refusal leaves the journal as it
    was. Once the proofs hold, the journal records them, the DROP (with its intent)
    and the end: ``failed_cleaned``, or ``cleanup_failed`` / ``retained_unknown`` when
    the DROP is refused or its outcome stays unknown.
    """
    op = _Operator(transport, work_dir, attempt_id, seconds, wall_clock)
    if not op.summary.needs_operator:
        raise StateError(
            f"attempt {attempt_id} ended {op.summary.state}; nothing to clean",
            code="nothing_to_clean",
        )
    where = op.table(database)  # before any query: a wrong --database asks nothing
    op.check_endpoint()  # the first query: another server proves nothing about this one
    proofs = op.prove_settled()
    found = op.ownership(*where, None) if where else None
    drop_id = mutation_query_id(op.summary.attempt_id, "drop")
    if found is not None and drop_id in op.summary.sent_mutations:
        # One query id per mutation, ever: a second DROP would need a new id and a person.
        raise StateError(
            f"attempt {attempt_id} already sent its DROP and the table remains",
            code="drop_already_sent",
        )
    run = op.run
    run.enter(StageState.CLEANUP)
    run.table_created_maybe = found is not None
    run.table_uuid = found.uuid if found else None
    for proof in proofs:
        run.event(StageState.CLEANUP, "termination_observed", remote=proof)
    ending = StageState.FAILED_CLEANED
    if found is not None and where is not None:
        try:
            gone = op.drop(StageState.CLEANUP, "drop", *where, found)
        except CleanupRefused as exc:
            run.record_failure(StageState.CLEANUP_FAILED, exc)
            raise
        except UNOBSERVABLE as exc:
            run.record_failure(StageState.RETAINED_UNKNOWN, exc)
            raise
        ending = StageState.FAILED_CLEANED if gone else StageState.RETAINED_UNKNOWN
    if ending is StageState.FAILED_CLEANED:
        shutil.rmtree(op.attempt_dir / "spool", ignore_errors=True)
        run.inventory = {}
    else:
        run.inventory["table"] = {**run.base["planned_ownership"], "uuid": run.table_uuid}
    run.event(ending, "operator_cleanup")
    return summarize(op.attempt_dir, read_events(op.attempt_dir))


def discard_attempt(
    transport: QueryPort,
    work_dir: Path,
    attempt_id: str,
    *,
    seconds: float = 120.0,
    database: str | None = None,
    expected_uuid: str | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> AttemptSummary:
    """Drop the staged table of a ``staged`` attempt that will never be published.

    Ownership is verified first (UUID as the journal and ``expected_uuid`` say, the
    ownership mark, the name); the DROP has a durable intent and the query id
    ``dpone-b02-<attempt>-discard``. Ends ``discarded``; an unknown DROP outcome leaves
    ``discarding`` (an operator looks, and may run discard again).
    """
    op = _Operator(transport, work_dir, attempt_id, seconds, wall_clock)
    state = StageState(op.summary.state)
    if state not in (StageState.STAGED, StageState.DISCARDING):
        raise StateError(
            f"attempt {attempt_id} is {state.value}, not staged; nothing to discard",
            code="not_staged",
        )
    where = op.table(database)
    assert where is not None  # a staged attempt always planned its table
    op.check_endpoint()
    if state is StageState.DISCARDING:
        op.prove_settled()
    found = op.ownership(*where, expected_uuid)
    discard_id = mutation_query_id(op.summary.attempt_id, "discard")
    if found is not None and discard_id in op.summary.sent_mutations:
        raise StateError(
            f"attempt {attempt_id} already sent its discard and the table remains",
            code="discard_already_sent",
        )
    run = op.run
    run.enter(StageState.DISCARDING)
    if found is not None and not op.drop(StageState.DISCARDING, "discard", *where, found):
        raise StateError(
            f"the discard of {where[0]}.{where[1]} has an unknown outcome; the journal "
            "stays at discarding",
            code="discard_unknown",
        )
    run.event(StageState.DISCARDED, "discarded")
    return summarize(op.attempt_dir, read_events(op.attempt_dir))
