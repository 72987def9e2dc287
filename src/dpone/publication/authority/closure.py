"""The closure of leases: each ended, its queries stopped and proven quiescent, together.

:class:`LeaseCloser` closes one lease or several at once. Each lease (one lease a user)
is closed and proven as it would be alone (:mod:`~dpone.publication.authority.lease_scope`
gives what is its own): under every user's dispatch gate (taken in sorted order), the
lease ends, its queries are killed, its HTTP sessions are closed and probed as its own
user (:mod:`~dpone.publication.authority.session_drain`), ``system.processes`` is sampled
over a window, its query log is accounted and its open sign-ins counted
(:mod:`~dpone.publication.authority.login_account`); its proof is appended to the store
under its own step key, proven or not. Only the closer's reads are shared
(:mod:`~dpone.publication.authority.closure_reads`): one KILL, each sample, one account
and one sign-in count for all the leases, and one window of samples (its waits) for the
whole set. The steps and what each proves are in docs/publication-principals.md ("The
authority"); the sharing in docs/publication.md ("Many tables in one run").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpone.connectors.http_connections import side_by_side
from dpone.errors import DponeError
from dpone.localserver.principal_pool import ROLE_INGEST
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_request import read
from dpone.ports.composition_snapshot import ClosureProof, PrincipalRef
from dpone.publication.authority import closure_reads
from dpone.publication.authority.closure_reads import LeaseFilter
from dpone.publication.authority.journal_evidence import AuthorityError
from dpone.publication.authority.lease_scope import LeaseScope
from dpone.publication.authority.login_account import (
    login_findings,
    settle_logins,
    started_and_logins,
)
from dpone.publication.authority.session_drain import CLOSED, SESSION_NOT_FOUND, SessionDrain
from dpone.publication.dispatch.dispatch_gate import Gate
from dpone.publication.dispatch.executor import SESSION_MARGIN_SECONDS, SESSION_TIMEOUT_SECONDS
from dpone.publication.principals.principal_issuers import PrincipalIssuer
from dpone.publication.store.holder_process import closing_here
from dpone.publication.store.leases import CLOSURE_STEP, lease_step_key


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


class ClosureUsersNotDistinct(AuthorityError):
    """Two leases of one user in one closure: each lease's reads are told apart by its
    user, so one closure takes one lease a user. (The registered code of principals
    that must be distinct users and are not.)"""

    code = "principals_not_distinct"


@dataclass
class _Closing:
    """One lease's part of a closure, filled in as the closure goes."""

    principal: PrincipalRef
    lease_active: bool
    scope: LeaseScope
    killed: list[dict[str, Any]] = field(default_factory=list)
    closes: list[dict[str, Any]] = field(default_factory=list)
    wait: float = 0.0
    own: list[str] = field(default_factory=list)
    gates: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def filter(self) -> LeaseFilter:
        return LeaseFilter(self.principal.user, self.scope, tuple(self.own))


@dataclass(frozen=True)
class LeaseCloser:
    """Closes leases for the authority (see the module doc); built for each closure
    from the authority's current parts."""

    issuer: PrincipalIssuer
    closer: QueryPort
    scope_of: Callable[[PrincipalRef], LeaseScope]
    gate: Gate
    policy: ClosurePolicy
    drain: SessionDrain
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    next_id: Callable[[str], str]
    deadline: Callable[[], float]
    note_step: Callable[[str, Mapping[str, Any]], object] | None

    def close(self, principals: Sequence[PrincipalRef]) -> list[ClosureProof]:
        """End each lease, stop its queries and prove it quiescent (custodial); the
        proofs in the order given, each also appended to the store under its lease's
        step key (``note_step``), proven or not.

        Every proof is offered to the store even when one cannot be stored; then the
        first store error is raised (``unnoted_leases`` in its details names the
        leases whose proof was not stored), as one lease's closure raises it.
        """
        users = [p.user for p in principals]
        if len(set(users)) != len(users):
            raise ClosureUsersNotDistinct(
                "a closure takes one lease a user; "
                f"{sorted({u for u in users if users.count(u) > 1})} appear more than once",
                users=users,
            )
        if not principals:
            return []
        # Marked from before the ends until the proofs are stored: another thread of
        # this process waits for them as it waits for another process's closure.
        with closing_here([p.lease_id for p in principals]):
            return self._close(principals, users)

    def _close(self, principals: Sequence[PrincipalRef], users: list[str]) -> list[ClosureProof]:
        with self.gate.held_for_all(users):
            started_us = self._server_micros()
            ended = [(p, self.issuer.revoke(p).active) for p in principals]
            # Read under the gates, after the ends: no dispatch can add an opening now.
            closing = [_Closing(p, active, self.scope_of(p)) for p, active in ended]
            killed = closure_reads.kill(self._rows, [c.filter for c in closing])
            for c, rows in zip(closing, killed or [[] for _ in closing], strict=True):
                c.killed = rows
            # Proven under the gates too (a second or less once the sessions are
            # closed): a pool verify, which signs in as every pool user, holds them as
            # well, so its sign-ins are never a lease's queries started after the
            # closure began.
            proofs = self._prove(closing, started_us)
        self._note(proofs)
        return proofs

    def _prove(self, closing: list[_Closing], started_us: int) -> list[ClosureProof]:
        # Each opened session is closed first (as its own user, every session of every
        # lease side by side); only one the close did not end is waited out.
        closes = side_by_side(
            [
                functools.partial(self.drain.close, c.principal.user, s)
                for c in closing
                for s in c.scope.sessions
                if s.may_exist
            ]
        )
        for c in closing:
            sessions = c.scope.sessions
            c.closes = [closes.pop(0) for s in sessions if s.may_exist]
            ended = [x["session_id"] for x in c.closes if x["ended"]]
            c.wait = self.drain.fallback_seconds(sessions, ended)
            # The closure's own requests as the user (its closes, then its probes) may
            # still be listed for a moment after they answered: they are not the lease's.
            c.own = [
                str(x[k]) for x in c.closes for k in ("close_query_id", "check_query_id") if k in x
            ]
        # One window for every lease: as long as the longest wait of them all.
        gate_at = self.clock() + max(c.wait for c in closing)
        spacing = self.policy.sample_spacing_seconds
        # Paced by the clock: each sample begins the spacing after the one before it
        # began, so a sample's own round trip does not lengthen the window.
        began = self.clock()
        self._sample(closing)
        while len(closing[0].samples) < self.policy.samples or self.clock() < gate_at:
            self.sleep(max(began + spacing - self.clock(), 0.0))
            began = self.clock()
            self._sample(closing)
        probes = side_by_side(
            [
                functools.partial(self.drain.probe, c.principal.user, s)
                for c in closing
                for s in c.scope.sessions
            ]
        )
        for c in closing:
            c.gates = [probes.pop(0) for _ in c.scope.sessions]
            c.own += [str(g["probe_query_id"]) for g in c.gates]
        self._sample(closing)
        accounts, first = self._account(closing, started_us)
        logins = self._logins(closing, first)
        return [
            self._proof(c, started_us, account, login)
            for c, account, login in zip(closing, accounts, logins, strict=True)
        ]

    def _proof(
        self,
        c: _Closing,
        started_us: int,
        account: dict[str, Any],
        logins: dict[str, Any],
    ) -> ClosureProof:
        unproven = ["lease_active"] if c.lease_active else []
        if any(s["queries"] for s in c.samples):
            unproven.append("processes_running")
        if any(g["answer"] != SESSION_NOT_FOUND for g in c.gates):
            unproven.append("session_open")
        if account["unfinished"]:
            unproven.append("query_log_unfinished")
        if account["started_after_closure"]:
            unproven.append("query_log_late_start")
        unproven += login_findings(logins, self.policy.accept_unobserved_logins)
        facts = {
            "user": c.principal.user,
            "lease_id": c.principal.lease_id,
            "lease_active": c.lease_active,
            "closure_started_us": started_us,
            "scope": c.scope.to_dict(),
            "gate_wait_ms": int(c.wait * 1000),
            "closes": c.closes,
            "killed": [
                {"query_id": str(r.get("query_id")), "kill_status": str(r.get("kill_status"))}
                for r in c.killed
            ],
            "samples": c.samples,
            "sessions": c.gates,
            "query_log": account,
            "logins": logins,
            "unproven": unproven,
        }
        if c.scope.role == ROLE_INGEST:
            # Staging's writes in a session are gated (a late one fails with 372): one
            # noted, or one not noted that the close found and ended. Otherwise (the
            # client transport, which has no sessions) none is.
            gated = any(s.opened for s in c.scope.sessions) or any(
                x["answer"] == CLOSED for x in c.closes
            )
            facts["ingest_gate"] = "http_session" if gated else "none"
        return ClosureProof(c.principal, not unproven, self.issuer.strength, facts)

    def _sample(self, closing: list[_Closing]) -> None:
        found = closure_reads.sample(self._rows, [c.filter for c in closing])
        for c, sample in zip(closing, found, strict=True):
            c.samples.append(sample)

    def _account(
        self, closing: list[_Closing], started_us: int
    ) -> tuple[list[dict[str, Any]], list[int | None]]:
        """Every query of each lease (see :class:`LeaseScope`) in the query log, and
        each user's open sign-ins, in one request after a flush."""
        self._flush()
        column = closure_reads.account_column([c.filter for c in closing], started_us)
        # A start without a finish from before the server's current process began was
        # cut by a stop or crash: the process that ran it is gone, so nothing of it can
        # still run or write. The bound is a second early (uptime() counts whole
        # seconds), so a query cut in the old process's last second stays unfinished.
        users = [c.principal.user for c in closing]
        restarted_us, open_logins, value = started_and_logins(self._rows, users, column)
        accounts = []
        for c, rows in zip(closing, closure_reads.account_rows(value, len(closing)), strict=True):
            cut = [
                str(r["query_id"])
                for r in rows
                if r["starts"] != r["ends"] and r["last"] < restarted_us
            ]
            accounts.append(
                {
                    "since_us": c.scope.issued_at_us,
                    "unfinished": [
                        str(r["query_id"])
                        for r in rows
                        if r["starts"] != r["ends"] and str(r["query_id"]) not in cut
                    ],
                    "settled_by_restart": cut,
                    "server_started_before_us": restarted_us,
                    "started_after_closure": [
                        str(r["query_id"]) for r in rows if r["last"] >= started_us
                    ],
                }
            )
        return accounts, open_logins

    def _logins(self, closing: list[_Closing], first: list[int | None]) -> list[dict[str, Any]]:
        """Each user's open sign-ins, read again together while some are open (see
        :mod:`dpone.publication.authority.login_account`); not judged once the user was
        leased again (the new lease's requests are its own)."""
        counted = {
            c.principal.user: count
            for c, count in zip(closing, first, strict=True)
            if not c.scope.relet
        }

        def again(users: list[str]) -> dict[str, int | None]:
            self._flush()
            return dict(zip(users, started_and_logins(self._rows, users)[1], strict=True))

        settled = settle_logins(
            counted, again, self.sleep, self.policy.samples, self.policy.sample_spacing_seconds
        )
        skipped = {"observed": False, "open": None, "reads": 0, "skipped": "relet"}
        return [settled.get(c.principal.user, dict(skipped)) for c in closing]

    def _note(self, proofs: list[ClosureProof]) -> None:
        if self.note_step is None:
            return
        failed: list[tuple[str, Exception]] = []
        for proof in proofs:
            lease_id = proof.principal.lease_id
            try:
                self.note_step(
                    lease_step_key(lease_id),
                    {
                        "step": CLOSURE_STEP,
                        "proven": proof.proven,
                        "strength": proof.strength.value,
                        "facts": proof.facts,
                    },
                )
            # One lease's proof that cannot be stored must not lose the others' (they
            # are offered all the same); the first error is raised after.
            except Exception as exc:
                failed.append((lease_id, exc))
        if failed:
            first = failed[0][1]
            if isinstance(first, DponeError):
                first.add_details(unnoted_leases=[lease_id for lease_id, _ in failed])
            raise first

    def _flush(self) -> None:
        self.closer.execute(
            read("SYSTEM FLUSH LOGS", self.next_id("flush")), deadline=self.deadline()
        )

    def _server_micros(self) -> int:
        rows = self._rows("SELECT toUnixTimestamp64Micro(now64(6)) AS us FORMAT JSONEachRow", "now")
        return int(rows[0]["us"])

    def _rows(self, sql: str, purpose: str) -> list[dict[str, Any]]:
        return self.closer.execute(
            read(sql, self.next_id(purpose)), deadline=self.deadline()
        ).json_rows()
