"""Finding attempts that need an operator, and their verified cleanup.

An attempt needs an operator when its journal ends in ``retained_unknown`` or
``cleanup_failed``, or ends without a terminal state at all (the process died).
Cleanup is allowed only when the terminal state of every mutation the journal shows
as sent is proven on the server, and only a table proven to be the attempt's own is
dropped. Nothing is ever inferred from silence.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone.adapters.file_attempt_journal import (
    ClickHouseFileAttemptJournal,
    JournalEvent,
    read_events,
)
from dpone.connectors.clickhouse_request import mutation, mutation_query_id
from dpone.connectors.remote_termination import prove_termination
from dpone.errors import DponeError, StateError
from dpone.ports.clickhouse import QueryPort
from dpone.runtime.clickhouse_file_stage_contract import StagingError
from dpone.runtime.staging_states import NEEDS_OPERATOR, TERMINAL
from dpone.runtime.validated_file_service import observe_ownership, table_exists
from dpone.sql import quote_identifier

RECOVERY_STEPS = (
    "prove the exact query's terminal state (KILL QUERY WHERE query_id = ... SYNC, or system.query_log)",
    "verify the staging table's ownership (its UUID and first-column comment) before any DROP",
    "archive the attempt directory (journal and spool)",
    "start a fresh attempt with a new attempt id",
)


@dataclass(frozen=True)
class AttemptSummary:
    """What an operator needs to know about one attempt."""

    attempt_id: str
    path: Path
    state: str
    last_sequence: int
    sent_mutations: tuple[str, ...]
    planned_table: dict[str, Any] | None
    table_uuid: str | None
    semantic_id: str | None
    error_code: str | None
    inventory: dict[str, Any]

    @property
    def needs_operator(self) -> bool:
        return self.state not in {s.value for s in TERMINAL} or self.state in {
            s.value for s in NEEDS_OPERATOR
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id, "path": str(self.path), "state": self.state,
            "last_sequence": self.last_sequence, "sent_mutations": list(self.sent_mutations),
            "planned_table": self.planned_table, "table_uuid": self.table_uuid,
            "semantic_id": self.semantic_id, "error_code": self.error_code,
            "inventory": self.inventory, "needs_operator": self.needs_operator,
            "recovery_steps": list(RECOVERY_STEPS) if self.needs_operator else [],
        }  # fmt: skip


def summarize(attempt_dir: Path, events: list[JournalEvent]) -> AttemptSummary:
    """Condense a verified journal."""
    sent: list[str] = []
    uuid = semantic = planned = None
    for event in events:
        doc = event.document
        query = doc.get("query")
        if (
            isinstance(query, dict)
            and query.get("query_id")
            and doc.get("outcome") in ("intent", "drop_intent")
        ):
            sent.append(str(query["query_id"]))
        uuid = (doc.get("observed_ownership") or {}).get("table_uuid", uuid)
        semantic = doc.get("semantic_id", semantic)
        planned = doc.get("planned_ownership", planned)
    last = events[-1].document if events else {}
    return AttemptSummary(
        attempt_id=attempt_dir.name, path=attempt_dir, state=str(last.get("state", "no_events")),
        last_sequence=events[-1].sequence if events else 0, sent_mutations=tuple(sent),
        planned_table=planned, table_uuid=uuid, semantic_id=semantic,
        error_code=last.get("error_code"), inventory=dict(last.get("cleanup_inventory") or {}),
    )  # fmt: skip


def list_attempts(work_dir: Path) -> list[AttemptSummary]:
    """Every attempt under ``work_dir`` (journals that do not verify raise)."""
    if not work_dir.is_dir():
        return []
    return [
        summarize(d, read_events(d)) for d in sorted(work_dir.iterdir()) if (d / "events").is_dir()
    ]


def cleanup_attempt(
    transport: QueryPort, work_dir: Path, attempt_id: str, *, seconds: float = 120.0
) -> AttemptSummary:
    """Verified cleanup of an attempt that needs an operator; refuses without proof."""
    attempt_dir = work_dir / attempt_id
    journal = ClickHouseFileAttemptJournal(work_dir, attempt_id)
    events = journal.resume()
    summary = summarize(attempt_dir, events)
    if not summary.needs_operator:
        raise StateError(
            f"attempt {attempt_id} ended {summary.state}; nothing to clean", code="nothing_to_clean"
        )
    deadline = time.monotonic() + seconds
    base = {
        k: events[-1].document.get(k)
        for k in ("endpoint", "transport", "planned_ownership")
        if events
    }
    for n, query_id in enumerate(summary.sent_mutations, start=1):
        state = prove_termination(
            transport,
            query_id,
            probe_prefix=f"dpone-b02-{attempt_id}-read-recovery-{n}",
            deadline=deadline,
        )
        journal.record({**base, "state": "cleanup", "outcome": "termination_observed",
                        "remote": {"query_id": query_id, "termination": state.termination.value, "source": state.source},
                        "cleanup_inventory": summary.inventory})  # fmt: skip
        if not state.proven_terminal:
            raise StateError(
                f"query {query_id} of attempt {attempt_id} has no proven terminal state; nothing dropped",
                code="termination_unproven", query_id=query_id,
            )  # fmt: skip
    if summary.planned_table is not None:
        _drop_if_owned(transport, journal, base, summary, deadline)
    spool = attempt_dir / "spool"
    if spool.exists():
        shutil.rmtree(spool)
    journal.record(
        {**base, "state": "failed_cleaned", "outcome": "operator_cleanup", "cleanup_inventory": {}}
    )
    return summarize(attempt_dir, read_events(attempt_dir))


def _drop_if_owned(
    transport: QueryPort, journal: ClickHouseFileAttemptJournal, base: dict[str, Any],
    summary: AttemptSummary, deadline: float,
) -> None:  # fmt: skip
    assert summary.planned_table is not None
    database, table = str(summary.planned_table["database"]), str(summary.planned_table["table"])
    counter = iter(range(1, 1000))
    found = observe_ownership(transport, database, table,
                              lambda: f"dpone-b02-{summary.attempt_id}-read-recovery-owned-{next(counter)}", deadline)  # fmt: skip
    if found is None:
        return
    if not found.belongs_to(summary.attempt_id, summary.semantic_id or "", summary.table_uuid):
        raise StateError(f"{database}.{table} is not proven to be attempt {summary.attempt_id}'s; not dropped",
                         code="ownership_unverified")  # fmt: skip
    drop_id = mutation_query_id(summary.attempt_id, "drop")
    if drop_id in summary.sent_mutations:
        # One query id per mutation, ever: a second DROP would need a new id and a person.
        raise StateError(f"attempt {summary.attempt_id} already sent its DROP and the table remains",
                         code="drop_already_sent")  # fmt: skip
    journal.record({**base, "state": "cleanup", "outcome": "drop_intent",
                    "query": {"kind": "drop", "query_id": drop_id},
                    "observed_ownership": {"table_uuid": found.uuid}, "cleanup_inventory": summary.inventory})  # fmt: skip
    try:
        transport.execute(mutation(f"DROP TABLE {quote_identifier(database)}.{quote_identifier(table)}", drop_id),
                          deadline=deadline)  # fmt: skip
    except DponeError as exc:
        raise StagingError(
            f"DROP of {database}.{table} did not complete: {exc.message}", code="cleanup_failed"
        ) from exc
    probe = f"dpone-b02-{summary.attempt_id}-read-recovery-dropped-1"
    if table_exists(transport, database, table, probe, deadline):
        raise StagingError(f"{database}.{table} still exists after DROP", code="drop_unverified")
