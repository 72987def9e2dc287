"""One revision of a publication's record, its members, and the vocabulary they use.

The record says where the publication is (state and revision) and what was observed;
``sha256`` is the digest of the exact canonical bytes that were stored.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot.checks import (
    COUNTER,
    NULLABLE_COUNTER,
    NULLABLE_TEXT,
    OBJECT_OR_NULL,
    check_content_digest,
    check_counter,
    check_header,
    check_sha256,
    check_text,
    check_timestamp,
    check_uuid,
)
from dpone.contracts.composition_snapshot.states import (
    P,
    SnapshotState,
    check_record_shape,
    check_transition,
)
from dpone.contracts.fields import DocumentError, MemberType, members

RECORD_KIND = "dpone.snapshot-record"
RECORD_VERSION = 1


class ClosureStrength(enum.Enum):
    """How strongly a principal was closed.

    ``revoked``: the server itself refuses the principal now (DROP USER / password
    rotated and applied). ``custodial``: the lease is closed and every query of the
    principal is proven finished, but the server would still accept its password
    (the embedded server cannot revoke users while it runs).
    """

    REVOKED = "revoked"
    CUSTODIAL = "custodial"


class DispatchOutcome(enum.Enum):
    """What one dispatch learned from the server's answer."""

    ACKNOWLEDGED = "acknowledged"  # complete success acknowledgment
    REFUSED = "refused"  # ClickHouse's own exception: the statement did not apply
    UNKNOWN = "unknown"  # it may have run
    NOT_SENT = "not_sent"  # provably never left this process


CLOSURE_STRENGTHS = frozenset(strength.value for strength in ClosureStrength)
DISPATCH_OUTCOMES = frozenset(outcome.value for outcome in DispatchOutcome)


@dataclass(frozen=True)
class RecordClaim:
    """The single dispatch claim (written by the 1 -> 2 compare-and-set)."""

    claim_id: str
    claimed_at: str


@dataclass(frozen=True)
class RecordClosure:
    """How the publisher principal was closed (``strength``: revoked or custodial)."""

    strength: str
    proven: bool
    lease_id: str


@dataclass(frozen=True)
class RecordObservation:
    """What reconcile observed; a member is None where it could not be observed."""

    target_uuid: str | None
    generation_uuid: str | None
    target_rows: int | None
    target_content_digest: str | None
    exchange_finishes: int | None  # QueryFinish rows of the exchange query id


@dataclass(frozen=True)
class RecordDispatch:
    """The answer this process got to its one EXCHANGE (``outcome``: DispatchOutcome value)."""

    query_id: str
    session_id: str | None
    outcome: str
    clickhouse_code: int | None


@dataclass(frozen=True)
class SnapshotRecord:
    """One revision of a publication's record. ``sha256`` is the digest of ``raw``.

    Document layout (every member required, nullable ones written as null)::

        {"kind": "dpone.snapshot-record", "record_version": 1,
         "intent_sha256": str, "state": str, "revision": int,
         "claim": {"claim_id", "claimed_at"} | null,
         "closure": {"strength", "proven", "lease_id"} | null,
         "observation": {"target_uuid", "generation_uuid", "target_rows",
                         "target_content_digest", "exchange_finishes"} | null,
         "dispatch": {"query_id", "session_id", "outcome", "clickhouse_code"} | null,
         "reason": str | null, "previous_record_sha256": str | null, "at": str}

    The shape must fit the state (``unreachable_state`` otherwise): see
    :func:`check_record_shape`.
    """

    intent_sha256: str
    state: SnapshotState
    revision: int
    claim: RecordClaim | None
    closure: RecordClosure | None
    observation: RecordObservation | None
    dispatch: RecordDispatch | None
    reason: str | None
    previous_record_sha256: str | None
    at: str
    raw: bytes = field(default=b"", repr=False)
    sha256: str = ""

    def to_document(self) -> dict[str, Any]:
        """The document of the record (``raw`` and ``sha256`` are not members)."""
        return {
            "kind": RECORD_KIND,
            "record_version": RECORD_VERSION,
            "intent_sha256": self.intent_sha256,
            "state": self.state.value,
            "revision": self.revision,
            "claim": _asdict(self.claim),
            "closure": _asdict(self.closure),
            "observation": _asdict(self.observation),
            "dispatch": _asdict(self.dispatch),
            "reason": self.reason,
            "previous_record_sha256": self.previous_record_sha256,
            "at": self.at,
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes of the record."""
        return canonical_json.dumps(self.to_document())

    def seal(self) -> SnapshotRecord:
        """This record parsed back from its canonical bytes (every rule checked)."""
        return SnapshotRecord.from_bytes(self.to_bytes())

    def successor(self, state: SnapshotState, *, at: str, **changes: Any) -> SnapshotRecord:
        """The next revision in ``state`` (edge checked), chained to this record, sealed."""
        check_transition(self.state, self.revision, state, self.revision + 1)
        draft = replace(
            self,
            state=state,
            revision=self.revision + 1,
            previous_record_sha256=self.sha256 or hashlib.sha256(self.to_bytes()).hexdigest(),
            at=at,
            raw=b"",
            sha256="",
            **changes,
        )
        return draft.seal()

    @classmethod
    def prepared(cls, intent_sha256: str, *, at: str) -> SnapshotRecord:
        """The first record of an intent: PREPARED at revision 1."""
        return cls(
            intent_sha256=intent_sha256,
            state=P.PREPARED,
            revision=1,
            claim=None,
            closure=None,
            observation=None,
            dispatch=None,
            reason=None,
            previous_record_sha256=None,
            at=at,
        ).seal()

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotRecord:
        """Parse exact canonical record bytes; refuse anything else (see class doc)."""
        obj = canonical_json.loads(data, what="snapshot record")
        doc = members(obj, _RECORD_SPEC, where="record")
        check_header(doc, "record_version", RECORD_KIND, RECORD_VERSION, where="record")
        state = _state(doc["state"])
        revision = check_counter(doc["revision"], where="record.revision")
        if revision < 1:
            raise DocumentError(
                "record.revision must be at least 1",
                code="invalid_counter",
                where="record.revision",
            )
        previous, reason = doc["previous_record_sha256"], doc["reason"]
        record = cls(
            intent_sha256=check_sha256(doc["intent_sha256"], where="record.intent_sha256"),
            state=state,
            revision=revision,
            claim=None if doc["claim"] is None else _claim(doc["claim"]),
            closure=None if doc["closure"] is None else _closure(doc["closure"]),
            observation=None if doc["observation"] is None else _observation(doc["observation"]),
            dispatch=None if doc["dispatch"] is None else _dispatch(doc["dispatch"]),
            reason=None if reason is None else check_text(reason, where="record.reason"),
            previous_record_sha256=(
                None
                if previous is None
                else check_sha256(previous, where="record.previous_record_sha256")
            ),
            at=check_timestamp(doc["at"], where="record.at"),
            raw=bytes(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        check_record_shape(record)
        return record


_RECORD_SPEC: dict[str, MemberType] = {
    "kind": str,
    "record_version": COUNTER,
    "intent_sha256": str,
    "state": str,
    "revision": COUNTER,
    "claim": OBJECT_OR_NULL,
    "closure": OBJECT_OR_NULL,
    "observation": OBJECT_OR_NULL,
    "dispatch": OBJECT_OR_NULL,
    "reason": NULLABLE_TEXT,
    "previous_record_sha256": NULLABLE_TEXT,
    "at": str,
}
_CLAIM_SPEC: dict[str, MemberType] = {"claim_id": str, "claimed_at": str}
_CLOSURE_SPEC: dict[str, MemberType] = {"strength": str, "proven": bool, "lease_id": str}
_OBSERVATION_SPEC: dict[str, MemberType] = {
    "target_uuid": NULLABLE_TEXT,
    "generation_uuid": NULLABLE_TEXT,
    "target_rows": NULLABLE_COUNTER,
    "target_content_digest": NULLABLE_TEXT,
    "exchange_finishes": NULLABLE_COUNTER,
}
_DISPATCH_SPEC: dict[str, MemberType] = {
    "query_id": str,
    "session_id": NULLABLE_TEXT,
    "outcome": str,
    "clickhouse_code": NULLABLE_COUNTER,
}


def _state(value: str) -> SnapshotState:
    try:
        return SnapshotState(value)
    except ValueError as exc:
        raise DocumentError(
            f"record.state {value!r} is not a snapshot state",
            code="unknown_state",
            where="record.state",
        ) from exc


def _claim(obj: Any) -> RecordClaim:
    fields = members(obj, _CLAIM_SPEC, where="record.claim")
    return RecordClaim(
        claim_id=check_text(fields["claim_id"], where="record.claim.claim_id"),
        claimed_at=check_timestamp(fields["claimed_at"], where="record.claim.claimed_at"),
    )


def _closure(obj: Any) -> RecordClosure:
    fields = members(obj, _CLOSURE_SPEC, where="record.closure")
    if fields["strength"] not in CLOSURE_STRENGTHS:
        raise DocumentError(
            f"record.closure.strength {fields['strength']!r} is not revoked or custodial",
            code="invalid_document",
            where="record.closure.strength",
        )
    return RecordClosure(
        strength=fields["strength"],
        proven=fields["proven"],
        lease_id=check_text(fields["lease_id"], where="record.closure.lease_id"),
    )


def _observation(obj: Any) -> RecordObservation:
    where = "record.observation"
    fields = members(obj, _OBSERVATION_SPEC, where=where)
    target, generation = fields["target_uuid"], fields["generation_uuid"]
    rows, digest = fields["target_rows"], fields["target_content_digest"]
    finishes = fields["exchange_finishes"]
    return RecordObservation(
        target_uuid=None if target is None else check_uuid(target, where=f"{where}.target_uuid"),
        generation_uuid=(
            None if generation is None else check_uuid(generation, where=f"{where}.generation_uuid")
        ),
        target_rows=None if rows is None else check_counter(rows, where=f"{where}.target_rows"),
        target_content_digest=(
            None
            if digest is None
            else check_content_digest(digest, where=f"{where}.target_content_digest")
        ),
        exchange_finishes=(
            None
            if finishes is None
            else check_counter(finishes, where=f"{where}.exchange_finishes")
        ),
    )


def _dispatch(obj: Any) -> RecordDispatch:
    where = "record.dispatch"
    fields = members(obj, _DISPATCH_SPEC, where=where)
    if fields["outcome"] not in DISPATCH_OUTCOMES:
        raise DocumentError(
            f"{where}.outcome {fields['outcome']!r} is not a dispatch outcome",
            code="invalid_document",
            where=f"{where}.outcome",
        )
    session, code = fields["session_id"], fields["clickhouse_code"]
    return RecordDispatch(
        query_id=check_text(fields["query_id"], where=f"{where}.query_id"),
        session_id=None if session is None else check_text(session, where=f"{where}.session_id"),
        outcome=fields["outcome"],
        clickhouse_code=(
            None if code is None else check_counter(code, where=f"{where}.clickhouse_code")
        ),
    )


def _asdict(
    value: RecordClaim | RecordClosure | RecordObservation | RecordDispatch | None,
) -> dict[str, Any] | None:
    return None if value is None else dict(vars(value))
