"""The publication authority: reopens the evidence, issues and closes principals.

``reopen`` never trusts a caller's object: it reads the staging journal from disk
(:func:`read_events` verifies sequence, chain and canonical bytes), requires the final
event to be ``staged`` and ``generation_ref`` to be exactly its SHA-256, reopens the
receipt and the derived identity the journal binds, the ingest principal that every
event names and its lease for the attempt, and the admission with its epochs. Any
inconsistency raises ``evidence_unverified`` naming what was wrong.

``close_principal`` (custodial on the embedded server, where a user cannot be
revoked while the server runs), under the lock shared with the executor:

1. the server's clock at the start, then the lease ends (no credentials from now on);
2. ``KILL QUERY WHERE user = <u> SYNC`` as the closer;
3. samples of ``system.processes`` for the user over a window (several, never one);
4. the drain gate for each HTTP session the principal may have used: after the
   session timeout T (plus a margin for the server's periodic sweep), a probe with
   the principal's credentials and ``session_check=1`` must answer 372
   SESSION_NOT_FOUND (nothing runs or can start in it); 373 or an open session is
   not proof. Sessions are per user on this server, so the probe uses the
   principal's own credentials, and it renews an open session for one second only;
5. ``SYSTEM FLUSH LOGS`` and the query-log account of the user: every QueryStart
   has its finish or exception, and nothing started after the closure began.

The proof is ``proven`` only when every step held; ``facts`` record all of it.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import QUERY_ID_PREFIX, SnapshotIntent
from dpone.contracts.receipt import FileReceipt
from dpone.errors import DponeError, StateError
from dpone.localserver.principal_pool import ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError
from dpone.ports.clickhouse_request import Credentials, Endpoint, RequestKind, read
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    AttemptRef,
    ClosureProof,
    GenerationEvidence,
    IssuedPrincipal,
    OwnershipState,
    ParentAuthority,
    PrincipalRef,
    PublicationEvidence,
    SnapshotRunRegistry,
    SourceEvidence,
)
from dpone.publication.executor import (
    SESSION_TIMEOUT_SECONDS,
    TransportFactory,
    session_request,
)
from dpone.publication.principal_issuers import PrincipalIssuer
from dpone.sql import quote_literal
from dpone.staging.journal import JournalEvent, read_events

SESSION_NOT_FOUND = 372
SESSION_IS_LOCKED = 373
_DIGEST = re.compile(r"^[0-9a-f]{32}$")


class AuthorityError(StateError):
    """The authority refused (see ``code``: evidence_unverified, attempt_fenced, ...)."""

    code = "authority_error"


@dataclass(frozen=True)
class ClosurePolicy:
    """How closure samples and waits. ``session_timeout`` must be the executor's T."""

    samples: int = 3
    sample_spacing_seconds: float = 0.5
    session_timeout: int = SESSION_TIMEOUT_SECONDS
    # The server drops expired sessions on a periodic sweep: a session created with
    # T = 2 still answered 2.05 s later (checked), so the probe waits a margin more.
    session_margin_seconds: float = 3.0
    request_seconds: float = 30.0


def _unverified(message: str, reason: str, **details: Any) -> AuthorityError:
    return AuthorityError(message, code="evidence_unverified", reason=reason, **details)


class SnapshotAuthority:
    """Implements ``SnapshotPublicationAuthority`` over a run registry and an issuer."""

    def __init__(
        self,
        *,
        registry: SnapshotRunRegistry,
        issuer: PrincipalIssuer,
        closer: QueryPort,
        endpoint: Endpoint,
        probe_credentials: Callable[[str], Credentials],
        sessions_of: Callable[[PrincipalRef], Sequence[str]],
        dispatch_lock: threading.Lock,
        policy: ClosurePolicy | None = None,
        transport_factory: TransportFactory = HttpTransport,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``closer`` runs as the closer principal; ``sessions_of`` names the HTTP sessions
        a principal may have used (for a publisher: its intent's exchange session)."""
        self.registry = registry
        self.issuer = issuer
        self.closer = closer
        self.endpoint = endpoint
        self.probe_credentials = probe_credentials
        self.sessions_of = sessions_of
        self.dispatch_lock = dispatch_lock
        self.policy = policy or ClosurePolicy()
        self._factory = transport_factory
        self._clock = clock
        self._sleep = sleep
        self._reads = 0

    # ------------------------------------------------------------------ reopen

    def reopen(self, attempt: AttemptRef, generation_ref: str) -> PublicationEvidence:
        """Reopen the journal's evidence and admit (or find) the attempt; see the module doc."""
        try:
            events = read_events(attempt.journal_dir)
        except DponeError as exc:
            raise _unverified(
                f"journal {attempt.journal_dir} does not verify: {exc.message}",
                "journal_invalid",
                journal=str(attempt.journal_dir),
                cause=exc.code,
            ) from exc
        if not events:
            raise _unverified(f"journal {attempt.journal_dir} has no events", "journal_empty")
        final = events[-1]
        doc = final.document
        where = {"journal": str(attempt.journal_dir), "event": final.sequence}
        if doc.get("state") != "staged" or doc.get("outcome") != "staged":
            raise _unverified(
                f"the final event is {doc.get('state')}/{doc.get('outcome')}, not staged",
                "final_not_staged",
                **where,
            )
        if generation_ref != final.sha256:
            raise _unverified(
                f"generation_ref {generation_ref[:16]}... is not the final event's digest",
                "generation_ref_mismatch",
                expected=final.sha256,
                **where,
            )
        attempt_id = str(doc["attempt_id"])
        receipt, receipt_sha = _receipt(events, where)
        generation = _generation(events, final, receipt_sha, where)
        planned = _member(doc, "planned_ownership", dict, where)
        if planned.get("database") != attempt.slot.database:
            raise _unverified(
                f"the generation is in database {planned.get('database')!r}, the target slot in "
                f"{attempt.slot.database!r}",
                "database_mismatch",
                **where,
            )
        if not receipt.rows_validated == generation.rows:
            raise _unverified(
                f"the receipt validated {receipt.rows_validated} rows, staging counted "
                f"{generation.rows}",
                "row_count_mismatch",
                **where,
            )
        endpoint = _member(doc, "endpoint_identity", dict, where)
        ingest = self._ingest(events, attempt_id, where)
        admission = self._admit(attempt, attempt_id)
        return PublicationEvidence(
            parent_request=admission.parent_request,
            attempt_id=attempt_id,
            epochs=admission.epochs,
            slot=attempt.slot,
            endpoint=endpoint,
            generation=generation,
            source=SourceEvidence(receipt_sha, receipt.rows_validated, receipt.artifact_size),
            ingest=ingest,
        )

    def _ingest(
        self, events: list[JournalEvent], attempt_id: str, where: Mapping[str, Any]
    ) -> PrincipalRef:
        named = {
            canonical_json.dumps(_member(e.document, "principal", dict, where)) for e in events
        }
        if len(named) != 1:
            raise _unverified(
                "the journal's events name different principals", "principal_inconsistent", **where
            )
        principal = _member(events[-1].document, "principal", dict, where)
        user = principal.get("user")
        if not isinstance(user, str) or not user:
            raise _unverified("the journal names no ingest user", "principal_missing", **where)
        try:
            known = self.issuer.user_uuid(user)
        except DponeError as exc:
            raise _unverified(
                f"ingest user {user} is not an issued principal",
                "principal_unknown",
                user=user,
                **where,
            ) from exc
        recorded = principal.get("user_uuid")
        if recorded is not None and recorded != known:
            raise _unverified(
                f"the journal says {user} has id {recorded}, the server {known}",
                "principal_uuid_mismatch",
                user=user,
                **where,
            )
        leases = [
            lease
            for lease in self.registry.leases_of(attempt_id)
            if lease.role == ROLE_INGEST and lease.user == user
        ]
        if len(leases) != 1:
            raise _unverified(
                f"attempt {attempt_id} has {len(leases)} ingest leases of {user}, not one",
                "ingest_lease_missing",
                user=user,
                **where,
            )
        return PrincipalRef(user, known, leases[0].lease_id)

    def _admit(self, attempt: AttemptRef, attempt_id: str) -> Admission:
        admission = self.registry.admit(attempt.slot, attempt_id)
        if admission.slot != attempt.slot or admission.attempt_id != attempt_id:
            raise _unverified(
                f"attempt {attempt_id} is admitted for {admission.slot}, not {attempt.slot}",
                "slot_mismatch",
                attempt_id=attempt_id,
            )
        self._current(admission, admission.epochs)
        return admission

    def _current(self, admission: Admission, epochs: AttemptEpochs) -> None:
        current = self.registry.current_epoch(admission.slot)
        if admission.epochs != epochs or current != epochs.slot_epoch:
            raise AuthorityError(
                f"attempt {admission.attempt_id} was admitted at slot epoch "
                f"{admission.epochs.slot_epoch}; the slot is at {current}",
                code="attempt_fenced",
                attempt_id=admission.attempt_id,
                slot_epoch=epochs.slot_epoch,
                current_epoch=current,
            )
        if admission.ownership is not OwnershipState.ACTIVE:
            raise AuthorityError(
                f"run {admission.parent_request} is {admission.ownership.value}, not active",
                code="ownership_not_active",
                ownership=admission.ownership.value,
            )

    # ------------------------------------------------------------------ principals

    def issue_publisher(self, evidence: PublicationEvidence) -> PrincipalRef:
        """Lease a publisher for the attempt (still admitted, current and ACTIVE)."""
        admission = self._admission(evidence.attempt_id)
        self._current(admission, evidence.epochs)
        issued = self.issuer.issue(ROLE_PUBLISHER, evidence.attempt_id)
        ref = issued.ref
        if ref.user == evidence.ingest.user or ref.user_uuid == evidence.ingest.user_uuid:
            self.issuer.revoke(ref)
            raise AuthorityError(
                f"publisher {ref.user} is the ingest principal", code="principals_not_distinct"
            )
        return ref

    def publisher_credentials(self, intent: SnapshotIntent) -> IssuedPrincipal:
        """The intent's exact publisher while its lease (for this attempt) is active."""
        bound = intent.publisher
        ref = PrincipalRef(bound.user, bound.user_uuid, bound.lease_id)
        lease = self.registry.get_lease(ref.lease_id)
        if lease.role != ROLE_PUBLISHER or lease.attempt_id != intent.attempt_id:
            raise AuthorityError(
                f"lease {ref.lease_id} is a {lease.role} lease of {lease.attempt_id}, not the "
                f"publisher of {intent.attempt_id}",
                code="principal_mismatch",
            )
        return self.issuer.credentials(ref)

    def principal_credentials(self, principal: PrincipalRef) -> IssuedPrincipal:
        """Credentials of an issued principal while its exact lease is active."""
        return self.issuer.credentials(principal)

    def recheck(self, intent: SnapshotIntent) -> ParentAuthority:
        """The run is admitted as the intent says, not fenced and ACTIVE."""
        admission = self._admission(intent.attempt_id)
        if admission.parent_request != intent.request_id or (
            admission.slot.database,
            admission.slot.table,
        ) != (intent.database, intent.target_table):
            raise AuthorityError(
                f"attempt {intent.attempt_id} is admitted under {admission.parent_request} for "
                f"{admission.slot}, not as the intent says",
                code="attempt_fenced",
            )
        self._current(admission, AttemptEpochs(intent.slot_epoch, intent.attempt_epoch))
        return ParentAuthority(admission.parent_request, admission.slot, intent.slot_epoch)

    def ownership(self, intent: SnapshotIntent) -> OwnershipState:
        """The run's ownership of its slot now."""
        return self._admission(intent.attempt_id).ownership

    def _admission(self, attempt_id: str) -> Admission:
        admission = self.registry.admission(attempt_id)
        if admission is None:
            raise AuthorityError(
                f"attempt {attempt_id} is not admitted",
                code="attempt_fenced",
                attempt_id=attempt_id,
            )
        return admission

    # ------------------------------------------------------------------ closure

    def close_principal(self, principal: PrincipalRef) -> ClosureProof:
        """End the lease, stop the principal's queries and prove it quiescent (custodial)."""
        with self.dispatch_lock:
            return self._close(principal)

    def _close(self, principal: PrincipalRef) -> ClosureProof:
        user = principal.user
        unproven: list[str] = []
        started_us = self._server_micros()
        lease = self.issuer.revoke(principal)
        if lease.active:
            unproven.append("lease_active")
        killed = self._rows(
            f"KILL QUERY WHERE user = {quote_literal(user)} SYNC FORMAT JSONEachRow", "kill"
        )
        sessions = tuple(self.sessions_of(principal))
        wait = self.policy.session_timeout + self.policy.session_margin_seconds if sessions else 0.0
        gate_at = self._clock() + wait
        samples = [self._sample(user)]
        while len(samples) < self.policy.samples or self._clock() < gate_at:
            self._sleep(self.policy.sample_spacing_seconds)
            samples.append(self._sample(user))
        gates = [self._probe(user, session) for session in sessions]
        samples.append(self._sample(user))
        busy = [s for s in samples if s["queries"]]
        if busy:
            unproven.append("processes_running")
        if any(g["answer"] != SESSION_NOT_FOUND for g in gates):
            unproven.append("session_open")
        probe_ids = [g["probe_query_id"] for g in gates]
        account = self._account(user, started_us, probe_ids)
        if account["unfinished"]:
            unproven.append("query_log_unfinished")
        if account["started_after_closure"]:
            unproven.append("query_log_late_start")
        facts = {
            "user": user,
            "lease_id": principal.lease_id,
            "lease_active": lease.active,
            "closure_started_us": started_us,
            "killed": [
                {"query_id": str(r.get("query_id")), "kill_status": str(r.get("kill_status"))}
                for r in killed
            ],
            "samples": samples,
            "sessions": gates,
            "query_log": account,
            "unproven": unproven,
        }
        return ClosureProof(principal, not unproven, self.issuer.strength, facts)

    def _server_micros(self) -> int:
        rows = self._rows("SELECT toUnixTimestamp64Micro(now64(6)) AS us FORMAT JSONEachRow", "now")
        return int(rows[0]["us"])

    def _sample(self, user: str) -> dict[str, Any]:
        # The server's own FIFO query runs as user '' over the Local interface; the
        # filter on a nonempty user name excludes it.
        rows = self._rows(
            f"SELECT query_id FROM system.processes WHERE user = {quote_literal(user)} "
            "FORMAT JSONEachRow",
            "sample",
        )
        return {"at_us": self._server_micros(), "queries": sorted(str(r["query_id"]) for r in rows)}

    def _probe(self, user: str, session_id: str) -> dict[str, Any]:
        probe_id = self._next_id(f"probe-{hashlib.sha256(session_id.encode()).hexdigest()[:12]}")
        transport = self._factory(self.endpoint, self.probe_credentials(user))
        request = session_request(
            "SELECT 1",
            probe_id,
            RequestKind.READ,
            session_id=session_id,
            session_timeout=1,
            check=True,
        )
        answer: int | str
        try:
            transport.execute(request, deadline=self._clock() + self.policy.request_seconds)
            answer = "open"
        except ClickHouseServerError as exc:
            code = exc.details.get("clickhouse_code")
            answer = code if isinstance(code, int) else exc.code
        except DponeError as exc:
            answer = exc.code
        return {"session_id": session_id, "probe_query_id": probe_id, "answer": answer}

    def _account(self, user: str, started_us: int, probe_ids: Sequence[str]) -> dict[str, Any]:
        self.closer.execute(
            read("SYSTEM FLUSH LOGS", self._next_id("flush")), deadline=self._deadline()
        )
        excluded = ", ".join(quote_literal(p) for p in ("", *probe_ids))
        rows = self._rows(
            "SELECT query_id, countIf(type = 'QueryStart') AS starts, "
            "countIf(type IN ('QueryFinish', 'ExceptionWhileProcessing')) AS ends, "
            "maxIf(toUnixTimestamp64Micro(event_time_microseconds), type = 'QueryStart') AS last "
            f"FROM system.query_log WHERE user = {quote_literal(user)} "
            f"AND query_id NOT IN ({excluded}) GROUP BY query_id "
            f"HAVING starts != ends OR (starts > 0 AND last >= {int(started_us)}) "
            "ORDER BY query_id FORMAT JSONEachRow",
            "account",
        )
        return {
            "unfinished": [str(r["query_id"]) for r in rows if r["starts"] != r["ends"]],
            "started_after_closure": [
                str(r["query_id"]) for r in rows if r["starts"] > 0 and r["last"] >= started_us
            ],
        }

    def _rows(self, sql: str, purpose: str) -> list[dict[str, Any]]:
        return self.closer.execute(
            read(sql, self._next_id(purpose)), deadline=self._deadline()
        ).json_rows()

    def _next_id(self, purpose: str) -> str:
        self._reads += 1
        return f"{QUERY_ID_PREFIX}-close-{purpose}-{time.time_ns()}-{self._reads}"

    def _deadline(self) -> float:
        return self._clock() + self.policy.request_seconds


# ---------------------------------------------------------------------- journal reading


def _member(doc: Mapping[str, Any], name: str, kind: type, where: Mapping[str, Any]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise _unverified(
            f"event member {name} is missing or not a {kind.__name__}",
            f"{name}_missing",
            member=name,
            **where,
        )
    return value


def _one(events: list[JournalEvent], outcome: str, where: Mapping[str, Any]) -> JournalEvent:
    found = [e for e in events if e.document.get("outcome") == outcome]
    if len(found) != 1:
        raise _unverified(
            f"the journal has {len(found)} {outcome} events, not one",
            f"{outcome}_event_missing",
            **where,
        )
    return found[0]


def _receipt(events: list[JournalEvent], where: Mapping[str, Any]) -> tuple[FileReceipt, str]:
    admitted = _one(events, "admitted", where)
    data = canonical_json.dumps(_member(admitted.document, "source_identity", dict, where))
    try:
        receipt = FileReceipt.from_bytes(data)
    except DponeError as exc:
        raise _unverified(
            f"the receipt does not parse: {exc.message}", "receipt_invalid", cause=exc.code, **where
        ) from exc
    if receipt.to_bytes() != data:
        raise _unverified("the receipt is not in its canonical form", "receipt_invalid", **where)
    return receipt, hashlib.sha256(data).hexdigest()


def _generation(
    events: list[JournalEvent], final: JournalEvent, receipt_sha: str, where: Mapping[str, Any]
) -> GenerationEvidence:
    identity = _member(_one(events, "prepared", where).document, "derived_identity", dict, where)
    doc = final.document
    semantic_id = _member(doc, "semantic_id", str, where)
    if canonical_json.sha256_hex(identity) != semantic_id:
        raise _unverified(
            "the semantic id is not the derived identity's digest", "semantic_id_mismatch", **where
        )
    if identity.get("source_receipt_sha256") != receipt_sha:
        raise _unverified("the derived identity names another receipt", "receipt_mismatch", **where)
    rows_digest = identity.get("rows_digest")
    if not isinstance(rows_digest, str) or not _DIGEST.match(rows_digest):
        raise _unverified(
            "the derived identity has no rows_digest (32 hex digits)",
            "rows_digest_missing",
            **where,
        )
    counts = _member(doc, "counts", dict, where)
    rows = identity.get("prepared_rows")
    rowbinary_bytes = identity.get("rowbinary_bytes")
    if not (
        isinstance(rows, int)
        and isinstance(rowbinary_bytes, int)
        and counts.get("prepared_rows") == rows == counts.get("observed_count")
    ):
        raise _unverified(
            f"staging counted {counts}, prepared {rows} rows", "count_mismatch", **where
        )
    planned = _member(doc, "planned_ownership", dict, where)
    observed = _member(doc, "observed_ownership", dict, where)
    table, table_uuid = planned.get("table"), observed.get("table_uuid")
    if not isinstance(table, str) or not isinstance(table_uuid, str) or not table_uuid:
        raise _unverified("the staged event names no table and UUID", "generation_missing", **where)
    return GenerationEvidence(
        table=table,
        table_uuid=table_uuid,
        staged_event_sha256=final.sha256,
        semantic_id=semantic_id,
        rows=rows,
        rowbinary_bytes=rowbinary_bytes,
        rows_digest=rows_digest,
    )
