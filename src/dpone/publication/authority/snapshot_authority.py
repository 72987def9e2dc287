"""The publication authority: reopens a staging attempt's evidence, issues and closes principals.

:class:`SnapshotAuthority` implements the authority port. ``reopen`` never trusts a
caller's object: it reads the staging journal, the receipt, the ingest principal and its
lease and the admission from disk and store, and any inconsistency is
``evidence_unverified`` naming what was wrong. ``close_principal`` acts on one lease
(:mod:`~dpone.publication.authority.lease_scope`) under the dispatch gate: it ends the
lease, kills and samples the lease's queries, drains its HTTP sessions
(:mod:`~dpone.publication.authority.session_drain`), accounts for its query log and its
open sign-ins (:mod:`~dpone.publication.authority.login_account`), and appends the proof
to the store under the lease's step key, proven or not. The steps and what each proves
are in docs/publication-principals.md ("The authority").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import QUERY_ID_PREFIX, SnapshotIntent
from dpone.errors import DponeError
from dpone.localserver.principal_pool import ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import OutcomeUnknown
from dpone.ports.clickhouse_request import Credentials, Endpoint, read
from dpone.ports.composition_snapshot import (
    Admission,
    AttemptEpochs,
    AttemptRef,
    ClosureProof,
    IssuedPrincipal,
    OwnershipState,
    ParentAuthority,
    PrincipalRef,
    PublicationEvidence,
    SnapshotRunRegistry,
    SourceEvidence,
)
from dpone.publication.authority.journal_evidence import (
    AuthorityError,
    generation_evidence,
    journal_member,
    journal_receipt,
    unverified,
)
from dpone.publication.authority.lease_scope import LeaseScope
from dpone.publication.authority.login_account import (
    login_findings,
    settle_logins,
    started_and_logins,
)
from dpone.publication.authority.session_drain import CLOSED, SESSION_NOT_FOUND, SessionDrain
from dpone.publication.dispatch.dispatch_gate import Gate
from dpone.publication.dispatch.executor import (
    SESSION_MARGIN_SECONDS,
    SESSION_TIMEOUT_SECONDS,
    TransportFactory,
)
from dpone.publication.principals.principal_issuers import PrincipalIssuer
from dpone.publication.store.leases import CLOSURE_STEP, lease_step_key
from dpone.sql import quote_literal
from dpone.staging.journal import JournalEvent, read_events


@dataclass(frozen=True)
class ClosurePolicy:
    """How closure samples and waits. ``session_timeout`` must be the executor's T."""

    samples: int = 3
    sample_spacing_seconds: float = 0.1
    session_timeout: int = SESSION_TIMEOUT_SECONDS
    # The server drops expired sessions on a periodic sweep: a session created with
    # T = 2 still answered 2.05 s later, and 372 came reliably from T + 2 s for T = 1,
    # 2 and 5 (checked), so the probe waits a margin more. A slower network between
    # this host and the server needs a larger margin (the answer's travel time).
    session_margin_seconds: float = SESSION_MARGIN_SECONDS
    request_seconds: float = 30.0
    # Without it, a closure that cannot count sign-ins is not proven (login_account.py).
    accept_unobserved_logins: bool = False


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
        scope_of: Callable[[PrincipalRef], LeaseScope],
        dispatch_gate: Gate,
        policy: ClosurePolicy | None = None,
        transport_factory: TransportFactory = HttpTransport,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], float] = time.time,
        note_step: Callable[[str, Mapping[str, Any]], object] | None = None,
    ) -> None:
        """``closer`` runs as the closer principal; ``scope_of`` reads what belongs to a
        lease (:func:`dpone.publication.authority.lease_scope.lease_scope`): its window, marks and
        sessions with their dispatch notes. ``wall_clock`` is the clock the executor
        notes its answers in (Unix seconds); ``note_step`` (the store's) keeps a probe
        that found a session open, so that the next closure waits the full T again."""
        self.registry = registry
        self.issuer = issuer
        self.closer = closer
        self.endpoint = endpoint
        self.probe_credentials = probe_credentials
        self.scope_of = scope_of
        self.dispatch_gate = dispatch_gate
        self.policy = policy or ClosurePolicy()
        self._factory = transport_factory
        self._clock = clock
        self._sleep = sleep
        self._wall_clock = wall_clock
        self._note_step = note_step
        self._reads = 0
        self._drain = SessionDrain(
            endpoint,
            probe_credentials,
            transport_factory,
            self._next_id,
            self._deadline,
            wall_clock,
            self.policy.session_timeout,
            self.policy.session_margin_seconds,
            note_step,
        )

    # ------------------------------------------------------------------ reopen

    def reopen(self, attempt: AttemptRef, generation_ref: str) -> PublicationEvidence:
        """Reopen the journal's evidence and admit (or find) the attempt; see the module doc."""
        try:
            events = read_events(attempt.journal_dir)
        except DponeError as exc:
            raise unverified(
                f"journal {attempt.journal_dir} does not verify: {exc.message}",
                "journal_invalid",
                journal=str(attempt.journal_dir),
                cause=exc.code,
            ) from exc
        if not events:
            raise unverified(f"journal {attempt.journal_dir} has no events", "journal_empty")
        final = events[-1]
        doc = final.document
        where = {"journal": str(attempt.journal_dir), "event": final.sequence}
        if doc.get("state") != "staged" or doc.get("outcome") != "staged":
            raise unverified(
                f"the final event is {doc.get('state')}/{doc.get('outcome')}, not staged",
                "final_not_staged",
                **where,
            )
        if generation_ref != final.sha256:
            raise unverified(
                f"generation_ref {generation_ref[:16]}... is not the final event's digest",
                "generation_ref_mismatch",
                expected=final.sha256,
                **where,
            )
        attempt_id = str(doc["attempt_id"])
        receipt, receipt_sha = journal_receipt(events, where)
        generation = generation_evidence(events, final, receipt_sha, where)
        planned = journal_member(doc, "planned_ownership", dict, where)
        if planned.get("database") != attempt.slot.database:
            raise unverified(
                f"the generation is in database {planned.get('database')!r}, the target slot in "
                f"{attempt.slot.database!r}",
                "database_mismatch",
                **where,
            )
        if not receipt.rows_validated == generation.rows:
            raise unverified(
                f"the receipt validated {receipt.rows_validated} rows, staging counted "
                f"{generation.rows}",
                "row_count_mismatch",
                **where,
            )
        endpoint = journal_member(doc, "endpoint_identity", dict, where)
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
            ingest_transport=doc["transport"] if isinstance(doc.get("transport"), str) else None,
            ingest_gated=doc["drain_gate"] if isinstance(doc.get("drain_gate"), bool) else None,
        )

    def _ingest(
        self, events: list[JournalEvent], attempt_id: str, where: Mapping[str, Any]
    ) -> PrincipalRef:
        named = {
            canonical_json.dumps(journal_member(e.document, "principal", dict, where))
            for e in events
        }
        if len(named) != 1:
            raise unverified(
                "the journal's events name different principals", "principal_inconsistent", **where
            )
        principal = journal_member(events[-1].document, "principal", dict, where)
        user = principal.get("user")
        if not isinstance(user, str) or not user:
            raise unverified("the journal names no ingest user", "principal_missing", **where)
        try:
            known = self.issuer.user_uuid(user)
        except DponeError as exc:
            raise unverified(
                f"ingest user {user} is not an issued principal",
                "principal_unknown",
                user=user,
                **where,
            ) from exc
        recorded = principal.get("user_uuid")
        if recorded is not None and recorded != known:
            raise unverified(
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
            raise unverified(
                f"attempt {attempt_id} has {len(leases)} ingest leases of {user}, not one",
                "ingest_lease_missing",
                user=user,
                **where,
            )
        return PrincipalRef(user, known, leases[0].lease_id)

    def _admit(self, attempt: AttemptRef, attempt_id: str) -> Admission:
        admission = self.registry.admit(attempt.slot, attempt_id)
        if admission.slot != attempt.slot or admission.attempt_id != attempt_id:
            raise unverified(
                f"attempt {attempt_id} is admitted for {admission.slot}, not {attempt.slot}",
                "slot_mismatch",
                attempt_id=attempt_id,
            )
        self._current(admission, admission.epochs)
        return admission

    def _current(self, admission: Admission, epochs: AttemptEpochs) -> None:
        current = self.registry.current_epoch(admission.slot)
        # A run takes its reserved epoch only when its intent is stored: until then the
        # slot must still be at the epoch before it (no newer attempt has prepared).
        expected = epochs.slot_epoch - (0 if admission.activated else 1)
        if admission.epochs != epochs or current != expected:
            raise AuthorityError(
                f"attempt {admission.attempt_id} was admitted for slot epoch "
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
        """End the lease, stop the lease's queries and prove it quiescent (custodial).

        The proof is appended to the store under the lease's step key (``note_step``),
        proven or not, so that who may write later is answered from what was proven
        (:meth:`~dpone.publication.store.leases.PrincipalLeases.closure_proven`); a
        proof that cannot be stored raises the store's error.
        """
        with self.dispatch_gate.held(principal.user):
            started_us = self._server_micros()
            lease = self.issuer.revoke(principal)
            # Read under the gate, after the end: no dispatch can add an opening now.
            scope = self.scope_of(principal)
            killed = self._kill(principal.user, scope)
            # Proven under the gate too (a second or less once the sessions are closed):
            # a pool verify, which signs in as every pool user, holds it as well, so its
            # sign-ins are never this lease's queries started after the closure began.
            proof = self._prove(principal, lease.active, scope, started_us, killed)
        if self._note_step is not None:
            self._note_step(
                lease_step_key(principal.lease_id),
                {
                    "step": CLOSURE_STEP,
                    "proven": proof.proven,
                    "strength": proof.strength.value,
                    "facts": proof.facts,
                },
            )
        return proof

    def _prove(
        self,
        principal: PrincipalRef,
        lease_active: bool,
        scope: LeaseScope,
        started_us: int,
        killed: list[dict[str, Any]],
    ) -> ClosureProof:
        user = principal.user
        unproven = ["lease_active"] if lease_active else []
        # Each opened session is closed first; only one the close did not end is waited out.
        closes = [self._drain.close(user, s) for s in scope.sessions if s.may_exist]
        ended = [c["session_id"] for c in closes if c["ended"]]
        wait = self._drain.fallback_seconds(scope.sessions, ended)
        gate_at = self._clock() + wait
        # The closure's own requests as the user (its closes, then its probes) may still
        # be listed for a moment after they answered: they are not the lease's.
        own = [str(c[k]) for c in closes for k in ("close_query_id", "check_query_id") if k in c]
        samples = [self._sample(user, scope, own)]
        while len(samples) < self.policy.samples or self._clock() < gate_at:
            self._sleep(self.policy.sample_spacing_seconds)
            samples.append(self._sample(user, scope, own))
        gates = [self._drain.probe(user, session) for session in scope.sessions]
        own += [str(g["probe_query_id"]) for g in gates]
        samples.append(self._sample(user, scope, own))
        if any(s["queries"] for s in samples):
            unproven.append("processes_running")
        if any(g["answer"] != SESSION_NOT_FOUND for g in gates):
            unproven.append("session_open")
        account = self._account(user, scope, started_us, own)
        if account["unfinished"]:
            unproven.append("query_log_unfinished")
        if account["started_after_closure"]:
            unproven.append("query_log_late_start")
        logins = self._logins(user, scope, account.pop("open_logins"))
        unproven += login_findings(logins, self.policy.accept_unobserved_logins)
        facts = {
            "user": user,
            "lease_id": principal.lease_id,
            "lease_active": lease_active,
            "closure_started_us": started_us,
            "scope": scope.to_dict(),
            "gate_wait_ms": int(wait * 1000),
            "closes": closes,
            "killed": [
                {"query_id": str(r.get("query_id")), "kill_status": str(r.get("kill_status"))}
                for r in killed
            ],
            "samples": samples,
            "sessions": gates,
            "query_log": account,
            "logins": logins,
            "unproven": unproven,
        }
        if scope.role == ROLE_INGEST:
            # Staging's writes in a session are gated (a late one fails with 372): one
            # noted, or one not noted that the close found and ended. Otherwise (the
            # client transport, which has no sessions) none is.
            gated = any(s.opened for s in scope.sessions) or any(
                c["answer"] == CLOSED for c in closes
            )
            facts["ingest_gate"] = "http_session" if gated else "none"
        return ClosureProof(principal, not unproven, self.issuer.strength, facts)

    def _kill(self, user: str, scope: LeaseScope) -> list[dict[str, Any]]:
        """KILL the lease's queries: all of the user's while the lease is its latest."""
        where = f"user = {quote_literal(user)}"
        if scope.relet:
            if not scope.marks:
                return []
            where += f" AND ({_marked(scope)})"
        return self._rows(f"KILL QUERY WHERE {where} SYNC FORMAT JSONEachRow", "kill")

    def _server_micros(self) -> int:
        rows = self._rows("SELECT toUnixTimestamp64Micro(now64(6)) AS us FORMAT JSONEachRow", "now")
        return int(rows[0]["us"])

    def _sample(self, user: str, scope: LeaseScope, own: Sequence[str]) -> dict[str, Any]:
        # The server's own FIFO query runs as user '' over the Local interface; the
        # filter on a nonempty user name excludes it. Once the user was leased again,
        # only this lease's marked queries are its own (the new lease's are not).
        where = f"user = {quote_literal(user)}"
        if own:
            where += f" AND query_id NOT IN ({', '.join(quote_literal(q) for q in own)})"
        if scope.relet:
            where += f" AND ({_marked(scope) if scope.marks else '0'})"
        # One request a sample: the server's clock (read as the query starts) and the
        # processes it lists then (a SELECT without FROM answers one row, whatever runs).
        rows = self._rows(
            "SELECT toUnixTimestamp64Micro(now64(6)) AS us, (SELECT groupArray(query_id) "
            f"FROM system.processes WHERE {where}) AS queries "
            # A profile's empty_result_for_aggregation_by_empty_set would make "none" an error.
            "SETTINGS empty_result_for_aggregation_by_empty_set = 0 FORMAT JSONEachRow",
            "sample",
        )
        row = rows[0] if len(rows) == 1 else {}
        at_us, queries = row.get("us"), row.get("queries")
        if not isinstance(at_us, int) or not isinstance(queries, list):
            raise OutcomeUnknown(
                f"the closure's process sample of {user} answered {rows!r:.200}",
                code="closure_sample_malformed",
                user=user,
            )
        return {"at_us": at_us, "queries": sorted(str(q) for q in queries)}

    def _account(
        self, user: str, scope: LeaseScope, started_us: int, probe_ids: Sequence[str]
    ) -> dict[str, Any]:
        """Every query of the lease (see :class:`LeaseScope`) in the query log."""
        self.closer.execute(
            read("SYSTEM FLUSH LOGS", self._next_id("flush")), deadline=self._deadline()
        )
        excluded = ", ".join(quote_literal(p) for p in ("", *probe_ids))
        # A query id is the lease's when its latest start is inside the lease (the lower
        # bound) and, once the user was leased again, it is marked or began before the end.
        owned = f"last >= {int(scope.issued_at_us)}"
        if scope.relet:
            ended = scope.ended_at_us if scope.ended_at_us is not None else started_us
            marked = _marked(scope) if scope.marks else "0"
            owned += f" AND (({marked}) OR first <= {int(ended)})"
        account = (
            "SELECT query_id, countIf(type = 'QueryStart') AS starts, "
            "countIf(type IN ('QueryFinish', 'ExceptionWhileProcessing')) AS ends, "
            "maxIf(toUnixTimestamp64Micro(event_time_microseconds), type = 'QueryStart') AS last, "
            "minIf(toUnixTimestamp64Micro(event_time_microseconds), type = 'QueryStart') AS first "
            f"FROM system.query_log WHERE user = {quote_literal(user)} "
            f"AND query_id NOT IN ({excluded}) GROUP BY query_id "
            f"HAVING starts > 0 AND {owned} AND (starts != ends OR last >= {int(started_us)}) "
            "ORDER BY query_id"
        )
        # A start without a finish from before the server's current process began was
        # cut by a stop or crash: the process that ran it is gone, so nothing of it can
        # still run or write. The bound is a second early (uptime() counts whole
        # seconds), so a query cut in the old process's last second stays unfinished.
        # Asked with the account and the user's open sign-ins, in one request.
        restarted_us, open_logins, rows = self._started_and_logins(user, account)
        cut = [
            str(r["query_id"])
            for r in rows
            if r["starts"] != r["ends"] and r["last"] < restarted_us
        ]
        return {
            "since_us": scope.issued_at_us,
            "unfinished": [
                str(r["query_id"])
                for r in rows
                if r["starts"] != r["ends"] and str(r["query_id"]) not in cut
            ],
            "settled_by_restart": cut,
            "server_started_before_us": restarted_us,
            "started_after_closure": [str(r["query_id"]) for r in rows if r["last"] >= started_us],
            "open_logins": open_logins,
        }

    def _started_and_logins(
        self, user: str, account: str | None = None
    ) -> tuple[int, int | None, list[dict[str, Any]]]:
        return started_and_logins(self._rows, user, account)

    def _logins(self, user: str, scope: LeaseScope, first: int | None) -> dict[str, Any]:
        """The user's open sign-ins, read again while some are open (see
        :mod:`dpone.publication.authority.login_account`); not judged once the user was leased
        again (the new lease's requests are its own)."""
        if scope.relet:
            return {"observed": False, "open": None, "reads": 0, "skipped": "relet"}

        def again() -> int | None:
            self.closer.execute(
                read("SYSTEM FLUSH LOGS", self._next_id("flush")), deadline=self._deadline()
            )
            return self._started_and_logins(user)[1]

        return settle_logins(
            first, again, self._sleep, self.policy.samples, self.policy.sample_spacing_seconds
        )

    def _rows(self, sql: str, purpose: str) -> list[dict[str, Any]]:
        return self.closer.execute(
            read(sql, self._next_id(purpose)), deadline=self._deadline()
        ).json_rows()

    def _next_id(self, purpose: str) -> str:
        self._reads += 1
        return f"{QUERY_ID_PREFIX}-close-{purpose}-{time.time_ns()}-{self._reads}"

    def _deadline(self) -> float:
        return self._clock() + self.policy.request_seconds


def _marked(scope: LeaseScope) -> str:
    """SQL: the query id carries one of the lease's marks."""
    return " OR ".join(f"startsWith(query_id, {quote_literal(m)})" for m in scope.marks)
