"""The snapshot authority: reopening the journal's evidence, fencing, principals, and
closure proofs on the managed server (plus fakes for samples a real server cannot stage)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dpone.connectors.clickhouse_http import HttpTransport
from dpone.contracts import canonical_json
from dpone.contracts.receipt import FileReceipt
from dpone.contracts.schema import SourceColumn, SourceSchema
from dpone.errors import DponeError
from dpone.localserver import ServerInfo
from dpone.localserver.principal_pool import CLOSER_USER, ROLE_INGEST, ROLE_PUBLISHER
from dpone.ports.clickhouse import QueryPort
from dpone.ports.clickhouse_errors import ClickHouseServerError, OutcomeUnknown
from dpone.ports.clickhouse_request import ClickHouseRequest, Credentials
from dpone.ports.clickhouse_result import QueryResult
from dpone.ports.composition_snapshot import (
    AttemptRef,
    ClosureStrength,
    OwnershipState,
    PrincipalRef,
    TargetSlot,
)
from dpone.publication.authority.journal_evidence import AuthorityError
from dpone.publication.authority.snapshot_authority import ClosurePolicy, SnapshotAuthority
from dpone.staging.journal import ClickHouseFileAttemptJournal, JournalEvent
from tests.plugins.managed_server import POOL_PASSWORDS
from tests.plugins.publication_pool import (
    DB,
    Pool,
    RunningQuery,
    make_authority,
    make_intent,
    make_pool,
    new_gate,
    scope_with,
)
from tests.profile_settings import ProfileSettings

DIGEST = "0123456789abcdef" * 2
SLOT = TargetSlot(DB, "target_authority")


def write_journal(
    work_dir: Path,
    attempt_id: str,
    ingest: PrincipalRef | None,
    *,
    rows: int = 2,
    identity_extra: dict[str, Any] | None = None,
    principals: list[dict[str, Any] | None] | None = None,
    database: str = DB,
) -> JournalEvent:
    """A staging journal as the staging service writes it (admitted, prepared, staged)."""
    receipt = FileReceipt(
        artifact_sha256="a" * 64,
        artifact_size=30,
        rows_validated=rows,
        schema=SourceSchema.of([SourceColumn("id", "bigint", False)]),
        codec_id="dpone.mssql-delimited.bulk-text",
        codec_version=2,
        policy_id="dpone.sqlserver-clickhouse.lossless",
        policy_version=1,
    )
    identity: dict[str, Any] = {
        "preparation_version": "dpone-preparation/2",
        "target_schema": [{"name": "id", "clickhouse_type": "Int64"}],
        "source_receipt_sha256": receipt.sha256,
        "binary_policy": "hex",
        "selected_mode": "python",
        "rowbinary_bytes": 8 * rows,
        "rowbinary_sha256": "b" * 64,
        "prepared_rows": rows,
        "rows_digest": DIGEST,
        **(identity_extra or {}),
    }
    identity = {k: v for k, v in identity.items() if v is not None}
    semantic = canonical_json.sha256_hex(identity)
    default = None if ingest is None else {"user": ingest.user, "user_uuid": None}
    named = principals or [default, default, default]
    base = {
        "endpoint": f"127.0.0.1:1/{database}",
        "transport": "http",
        "endpoint_identity": {
            "server_id": str(uuid.uuid4()),
            "server_id_source": "dpone_identity_table",
            "database": database,
            "database_uuid": str(uuid.uuid4()),
            "database_engine": "Atomic",
        },
        "planned_ownership": {"database": database, "table": f"dpone_stage_{attempt_id}"},
        "cleanup_inventory": {},
    }
    journal = ClickHouseFileAttemptJournal(work_dir, attempt_id)
    journal.open()
    docs = [
        {"state": "checking", "outcome": "admitted", "source_identity": receipt.to_document()},
        {
            "state": "prepared",
            "outcome": "prepared",
            "derived_identity": identity,
            "semantic_id": semantic,
        },
        {
            "state": "staged",
            "outcome": "staged",
            "semantic_id": semantic,
            "counts": {"prepared_rows": rows, "observed_count": rows},
            "observed_ownership": {"table_uuid": str(uuid.uuid4())},
        },
    ]
    event = None
    for doc, principal in zip(docs, named, strict=True):
        extra = {} if principal is None else {"principal": principal}
        event = journal.record({**base, **extra, **doc})
    assert event is not None
    return event


@pytest.fixture(name="pool")
def fresh_pool(clickhouse: ServerInfo, pool_credentials: dict[str, Credentials]) -> Pool:
    return make_pool(clickhouse, pool_credentials)


@pytest.fixture
def authority(pool: Pool) -> SnapshotAuthority:
    return make_authority(pool, new_gate(), {})


def staged(
    pool: Pool, tmp_path: Path, attempt_id: str, **kwargs: Any
) -> tuple[AttemptRef, JournalEvent, PrincipalRef]:
    ingest = pool.issuer.issue(ROLE_INGEST, attempt_id).ref
    final = write_journal(tmp_path, attempt_id, ingest, **kwargs)
    return AttemptRef(tmp_path / attempt_id, SLOT), final, ingest


def unverified(authority: SnapshotAuthority, attempt: AttemptRef, ref: str) -> str:
    with pytest.raises(AuthorityError) as failure:
        authority.reopen(attempt, ref)
    assert failure.value.code == "evidence_unverified"
    return str(failure.value.details["reason"])


# ---------------------------------------------------------------------- reopen


def test_reopen_binds_the_journal_the_receipt_the_principal_and_the_admission(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    attempt, final, ingest = staged(pool, tmp_path, "r1")
    evidence = authority.reopen(attempt, final.sha256)
    assert evidence.attempt_id == "r1" and evidence.slot == SLOT
    assert evidence.generation.staged_event_sha256 == final.sha256
    assert evidence.generation.table == "dpone_stage_r1"
    assert evidence.generation.table_uuid == final.document["observed_ownership"]["table_uuid"]
    assert (evidence.generation.rows, evidence.generation.rowbinary_bytes) == (2, 16)
    assert evidence.generation.rows_digest == DIGEST
    assert evidence.source.rows == 2 and evidence.source.bytes == 30
    admitted = json.loads((tmp_path / "r1/events/000001/attempt.json").read_bytes())
    receipt_bytes = canonical_json.dumps(admitted["source_identity"])
    assert evidence.source.receipt_sha256 == hashlib.sha256(receipt_bytes).hexdigest()
    assert evidence.ingest == ingest
    assert evidence.ingest.user_uuid == pool.user_ids[ingest.user]
    assert evidence.epochs.slot_epoch == pool.registry.current_epoch(SLOT) == 1
    assert evidence.endpoint["database"] == DB
    # Reopening again finds the same admission (no new epoch).
    assert authority.reopen(attempt, final.sha256).epochs == evidence.epochs


def test_reopen_refuses_another_generation_ref(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    attempt, final, _ = staged(pool, tmp_path, "r2")
    assert unverified(authority, attempt, "0" * 64) == "generation_ref_mismatch"
    previous = final.document["previous_sha256"]
    assert unverified(authority, attempt, previous) == "generation_ref_mismatch"


def test_reopen_refuses_a_journal_whose_final_event_is_not_staged(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    attempt, final, _ = staged(pool, tmp_path, "r3")
    journal = ClickHouseFileAttemptJournal(tmp_path, "r3")
    journal.resume()
    later = journal.record({**final.document, "state": "cleanup", "outcome": "started"})
    assert unverified(authority, attempt, final.sha256) == "final_not_staged"
    assert unverified(authority, attempt, later.sha256) == "final_not_staged"


def test_reopen_refuses_a_tampered_event(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    attempt, final, _ = staged(pool, tmp_path, "r4")
    path = tmp_path / "r4/events/000002/attempt.json"
    path.chmod(0o600)
    document = json.loads(path.read_bytes())
    document["derived_identity"]["prepared_rows"] = 3
    path.write_bytes(canonical_json.dumps(document))
    assert unverified(authority, attempt, final.sha256) == "journal_invalid"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"identity_extra": {"rows_digest": None}}, "rows_digest_missing"),
        ({"identity_extra": {"rows_digest": "XYZ"}}, "rows_digest_missing"),
        ({"identity_extra": {"source_receipt_sha256": "9" * 64}}, "receipt_mismatch"),
        ({"database": "dpone_elsewhere"}, "database_mismatch"),
    ],
)
def test_reopen_refuses_inconsistent_evidence(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path, kwargs: dict[str, Any], reason: str
) -> None:
    attempt, final, _ = staged(pool, tmp_path, "r5", **kwargs)
    assert unverified(authority, attempt, final.sha256) == reason


def test_reopen_refuses_an_unleased_or_inconsistent_principal(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    ingest = pool.issuer.issue(ROLE_INGEST, "p1").ref
    other = pool.issuer.issue(ROLE_INGEST, "elsewhere").ref
    cases: dict[str, tuple[list[dict[str, Any] | None], str]] = {
        "p1": ([{"user": other.user, "user_uuid": None}] * 3, "ingest_lease_missing"),
        "p2": ([None, None, None], "principal_missing"),
        "p3": (
            [
                {"user": ingest.user, "user_uuid": None},
                {"user": other.user, "user_uuid": None},
                {"user": ingest.user, "user_uuid": None},
            ],
            "principal_inconsistent",
        ),
        "p4": (
            [{"user": ingest.user, "user_uuid": other.user_uuid}] * 3,
            "principal_uuid_mismatch",
        ),
        "p5": ([{"user": "default", "user_uuid": None}] * 3, "principal_unknown"),
    }
    for attempt_id, (principals, reason) in cases.items():
        final = write_journal(tmp_path, attempt_id, ingest, principals=principals)
        assert (
            unverified(authority, AttemptRef(tmp_path / attempt_id, SLOT), final.sha256) == reason
        )


# ---------------------------------------------------------------------- fencing and principals


def test_a_newer_attempt_fences_the_older_one(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    old_attempt, old_final, old_ingest = staged(pool, tmp_path, "old")
    old = authority.reopen(old_attempt, old_final.sha256)
    publisher = authority.issue_publisher(old)
    intent = make_intent(publisher, old_ingest, "g", SLOT.table, attempt_id="old")
    assert authority.recheck(intent).slot_epoch == 1
    new_attempt, new_final, _ = staged(pool, tmp_path, "new")
    assert authority.reopen(new_attempt, new_final.sha256).epochs.slot_epoch == 2
    with pytest.raises(AuthorityError) as fenced:
        authority.recheck(intent)
    assert fenced.value.code == "attempt_fenced"
    with pytest.raises(AuthorityError) as again:
        authority.reopen(old_attempt, old_final.sha256)
    assert again.value.code == "attempt_fenced"
    assert authority.ownership(intent) is OwnershipState.RETIRING


def test_ownership_must_be_active_and_the_publisher_is_distinct(
    pool: Pool, authority: SnapshotAuthority, tmp_path: Path
) -> None:
    attempt, final, ingest = staged(pool, tmp_path, "own")
    evidence = authority.reopen(attempt, final.sha256)
    publisher = authority.issue_publisher(evidence)
    assert publisher.user != ingest.user and publisher.user_uuid != ingest.user_uuid
    intent = make_intent(publisher, ingest, "g", SLOT.table, attempt_id="own")
    issued = authority.publisher_credentials(intent)
    assert issued.credentials.password == POOL_PASSWORDS[publisher.user]
    assert authority.principal_credentials(publisher).ref == publisher
    wrong = make_intent(ingest, publisher, "g", SLOT.table, attempt_id="own")
    with pytest.raises(AuthorityError) as mismatch:
        authority.publisher_credentials(wrong)
    assert mismatch.value.code == "principal_mismatch"
    pool.registry.set_ownership(evidence.parent_request, OwnershipState.RETIRING)
    with pytest.raises(AuthorityError) as retiring:
        authority.recheck(intent)
    assert retiring.value.code == "ownership_not_active"
    with pytest.raises(AuthorityError):
        authority.issue_publisher(evidence)


# ---------------------------------------------------------------------- closure


def test_closure_kills_a_running_query_then_proves_quiescence(
    pool: Pool, authority: SnapshotAuthority
) -> None:
    ingest = pool.issuer.issue(ROLE_INGEST, "close").ref
    query_id = f"authority-slow-{uuid.uuid4().hex}"
    with RunningQuery(pool.port, ingest.user, POOL_PASSWORDS[ingest.user], query_id) as running:
        proof = authority.close_principal(ingest)
        running.thread.join(timeout=60)
    assert proof.proven, proof.facts["unproven"]
    assert proof.strength is ClosureStrength.CUSTODIAL and proof.principal == ingest
    assert {"query_id": query_id, "kill_status": "finished"} in proof.facts["killed"]
    samples = proof.facts["samples"]
    assert len(samples) >= 3 and all(s["queries"] == [] for s in samples)
    assert samples[-1]["at_us"] > samples[0]["at_us"]
    account = dict(proof.facts["query_log"])
    # The server ran throughout: its process began before the closure, and nothing was cut.
    assert 0 < account.pop("server_started_before_us") < proof.facts["closure_started_us"]
    assert account == {
        "since_us": 0,
        "unfinished": [],
        "settled_by_restart": [],
        "started_after_closure": [],
    }
    assert not pool.registry.get_lease(ingest.lease_id).active
    with pytest.raises(DponeError):
        authority.principal_credentials(ingest)


def scripted_authority(pool: Pool, closer: QueryPort) -> SnapshotAuthority:
    """An authority over ``pool`` whose closer answers from a script, sampling without
    waiting, each lease's scope empty."""
    return SnapshotAuthority(
        registry=pool.registry,
        issuer=pool.issuer,
        closer=closer,
        endpoint=pool.endpoint(),
        probe_credentials=pool.issuer.role_credentials,
        scope_of=lambda ref: scope_with(ref.lease_id, []),
        dispatch_gate=new_gate(),
        policy=ClosurePolicy(samples=3, sample_spacing_seconds=0.0),
        sleep=lambda s: None,
    )


class ScriptedCloser:
    """A closer port answering from a script (faults the real server cannot stage on cue)."""

    name = "scripted"

    def __init__(
        self,
        samples: list[list[str]],
        unfinished: list[str] | None = None,
        process_started_us: int = 0,
        logins: list[int | None] | None = None,
    ) -> None:
        self.samples = samples
        self.unfinished = unfinished or []
        self.process_started_us = process_started_us  # the unfinished ones started at 10
        # The open sign-ins each read answers (None: no session log); then 0.
        self.logins = logins or []
        self.login_reads = 0

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        sql = request.statement
        rows: list[dict[str, Any]] = []
        if "uptime()" in sql:  # the server's start, open sign-ins, the query log's rows
            row: dict[str, Any] = {"us": self.process_started_us}
            if "session_log" in sql:
                self.login_reads += 1
                count = self.logins.pop(0) if self.logins else 0
                if count is None:
                    raise ClickHouseServerError("no session log", clickhouse_code=60)
                row["open_logins"] = count
            if "query_log" in sql:
                logged = [
                    {"query_id": q, "starts": 1, "ends": 0, "last": 10} for q in self.unfinished
                ]
                row["rows"] = [json.dumps(r) for r in logged]
            rows = [row]
        elif "FROM system.processes" in sql:  # a sample: the clock and the queries listed
            rows = [{"us": 1_000, "queries": self.samples.pop(0) if self.samples else []}]
        elif "now64" in sql:
            rows = [{"us": 1_000}]
        output = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
        return QueryResult(request.query_id, output, None, None, self.name, None)


@pytest.mark.parametrize(
    ("samples", "unfinished", "reason"),
    [
        ([[], ["late-q"], []], [], "processes_running"),
        ([[], [], [], ["after-gate"]], [], "processes_running"),
        ([[], [], [], []], ["open-q"], "query_log_unfinished"),
    ],
)
def test_one_empty_sample_is_never_proof(
    pool: Pool, samples: list[list[str]], unfinished: list[str], reason: str
) -> None:
    ingest = pool.issuer.issue(ROLE_INGEST, "scripted").ref
    authority = scripted_authority(pool, ScriptedCloser(samples, unfinished))
    proof = authority.close_principal(ingest)
    assert not proof.proven and reason in proof.facts["unproven"]
    assert proof.facts["samples"][0]["queries"] == []


class MalformedAccount(ScriptedCloser):
    """A closer whose query-log account answers ``row`` (a shape no server sends)."""

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__([[], [], []])
        self.row = row

    def execute(self, request: ClickHouseRequest, *, deadline: float) -> QueryResult:
        if "uptime()" not in request.statement:
            return super().execute(request, deadline=deadline)
        output = json.dumps(self.row).encode() + b"\n"
        return QueryResult(request.query_id, output, None, None, self.name, None)


@pytest.mark.parametrize(
    "row",
    [
        {"us": 1, "open_logins": 0},
        {"us": 1, "open_logins": 0, "rows": "x"},
        {"us": 1, "open_logins": 0, "rows": ["not json"]},
        {"us": 1, "open_logins": 0, "rows": ["1"]},
    ],
)
def test_an_account_of_another_shape_is_never_proof(pool: Pool, row: dict[str, Any]) -> None:
    ingest = pool.issuer.issue(ROLE_INGEST, "malformed").ref
    authority = scripted_authority(pool, MalformedAccount(row))
    with pytest.raises(OutcomeUnknown) as caught:
        authority.close_principal(ingest)
    assert caught.value.code == "closure_account_malformed"


def test_a_start_cut_by_an_earlier_server_process_is_settled_by_the_restart(pool: Pool) -> None:
    """An unfinished start from before the server's process began cannot still run."""

    def close(process_started_us: int) -> Any:
        ingest = pool.issuer.issue(ROLE_INGEST, f"restart-{process_started_us}").ref
        authority = scripted_authority(
            pool, ScriptedCloser([[], [], []], ["cut-q"], process_started_us)
        )
        return authority.close_principal(ingest)

    restarted = close(process_started_us=11)  # the start (at 10) was the old process's
    assert restarted.proven, restarted.facts["unproven"]
    assert restarted.facts["query_log"]["settled_by_restart"] == ["cut-q"]
    assert restarted.facts["query_log"]["unfinished"] == []
    same = close(process_started_us=10)  # the start was this process's: still unfinished
    assert not same.proven and "query_log_unfinished" in same.facts["unproven"]
    assert same.facts["query_log"]["unfinished"] == ["cut-q"]


def test_a_closers_profile_cannot_turn_an_empty_sample_into_an_error(pool: Pool) -> None:
    """empty_result_for_aggregation_by_empty_set = 1 in the closer's profile: a sample
    that finds no process is still one row, and the closure proves quiescence."""
    ingest = pool.issuer.issue(ROLE_INGEST, "profiled").ref
    authority = make_authority(pool, new_gate(), {})
    authority.closer = ProfileSettings(
        HttpTransport(pool.endpoint(), pool.credentials[CLOSER_USER]),
        empty_result_for_aggregation_by_empty_set="1",
    )
    proof = authority.close_principal(ingest)
    assert proof.proven, proof.facts["unproven"]
    assert all(s["queries"] == [] for s in proof.facts["samples"])


@pytest.mark.parametrize(
    ("logins", "proven", "facts"),
    [
        # A logout logged a moment after its answer: read again, settled.
        ([1, 0], True, {"observed": True, "open": 0, "reads": 2}),
        # A request held open: read again up to the sample count, then refused.
        ([1, 1, 1, 1, 1], False, {"observed": True, "open": 1, "reads": 4}),
        # No session log: said, not assumed, and not proven (logins_unobservable).
        ([None], False, {"observed": False, "open": None, "reads": 1}),
        # More logouts than logins: the log lost rows, the count proves nothing.
        ([-1], False, {"observed": False, "open": None, "reads": 1}),
    ],
)
def test_open_sign_ins_are_read_again_then_refused(
    pool: Pool, logins: list[int | None], proven: bool, facts: dict[str, Any]
) -> None:
    ingest = pool.issuer.issue(ROLE_INGEST, f"logins-{len(logins)}-{proven}").ref
    closer = ScriptedCloser([[], [], []], logins=logins)
    authority = scripted_authority(pool, closer)
    proof = authority.close_principal(ingest)
    assert proof.proven is proven
    assert proof.facts["logins"] == facts
    open_or_unseen = {"logins_open", "logins_unobservable"} & set(proof.facts["unproven"])
    assert bool(open_or_unseen) is not proven


def test_a_publisher_closure_blind_to_the_session_log_is_not_proven(pool: Pool) -> None:
    """Before: a closure that could not read the session log was proven all the same,
    and only the ingest's prepare refused it; a publisher's request held open outside
    its session (an INSERT into the target with its body held) went unseen (issue 37)."""
    publisher = pool.issuer.issue(ROLE_PUBLISHER, "blind-closer").ref
    # A closer without SELECT on system.session_log, on the real server: an ingest
    # principal reads the processes and the query log and flushes the logs, no more.
    blind = sorted(u for u in pool.credentials if u.startswith("dpone_ingest_"))[-1]

    def closing(accept: bool) -> SnapshotAuthority:
        return SnapshotAuthority(
            registry=pool.registry,
            issuer=pool.issuer,
            closer=HttpTransport(pool.endpoint(), pool.credentials[blind]),
            endpoint=pool.endpoint(),
            probe_credentials=pool.issuer.role_credentials,
            scope_of=lambda ref: scope_with(ref.lease_id, []),
            dispatch_gate=new_gate(),
            policy=ClosurePolicy(
                samples=3, sample_spacing_seconds=0.0, accept_unobserved_logins=accept
            ),
        )

    proof = closing(False).close_principal(publisher)
    assert proof.facts["logins"] == {"observed": False, "open": None, "reads": 1}
    assert not proof.proven and proof.facts["unproven"] == ["logins_unobservable"]
    # Accepted by the operator ([publication] accept_ungated_ingest): proven on the
    # process samples and the query log alone, as before.
    accepted = closing(True).close_principal(publisher)
    assert accepted.proven and accepted.facts["unproven"] == [], accepted.facts["unproven"]
