"""Documents of atomic snapshot publication: the intent, the record, the limits.

Pure: no I/O. The intent is immutable and binds everything a publication depends on;
the record says where the publication is (state and revision) and what was observed.
Both are canonical JSON (:mod:`dpone.contracts.canonical_json`); their digests are
SHA-256 of the exact canonical bytes that were stored, never of a re-serialisation.

States and revisions (the seed's table)::

    PREPARED        exactly 1   no dispatch claim yet
    EXCHANGE_INTENT exactly 2   the single claim is durable, the SQL outcome unknown
    PUBLISHED       >= 3        closed publisher, observed B/A UUID pair, full B parity
    NOT_PUBLISHED   >= 2        closed publisher and A/B observed; 2 only by cancellation
    COMMIT_UNKNOWN  >= 3        something uncertain; ownership retained

Edges: none -> PREPARED(1); PREPARED(1) -> EXCHANGE_INTENT(2) | NOT_PUBLISHED(2);
EXCHANGE_INTENT(2) -> PUBLISHED(3) | NOT_PUBLISHED(3) | COMMIT_UNKNOWN(3);
COMMIT_UNKNOWN(n) -> PUBLISHED(n+1) | NOT_PUBLISHED(n+1). Never PREPARED -> COMMIT_UNKNOWN.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.fields import DocumentError, MemberType, members
from dpone.errors import StateError

INTENT_KIND = "dpone.snapshot-intent"
INTENT_VERSION = 1
RECORD_KIND = "dpone.snapshot-record"
RECORD_VERSION = 1
QUERY_ID_PREFIX = "dpone-s00"


class SnapshotState(enum.Enum):
    """Where one publication is."""

    PREPARED = "prepared"
    EXCHANGE_INTENT = "exchange_intent"
    PUBLISHED = "published"
    NOT_PUBLISHED = "not_published"
    COMMIT_UNKNOWN = "commit_unknown"


P = SnapshotState
TERMINAL = frozenset({P.PUBLISHED, P.NOT_PUBLISHED})


def revision_ok(state: SnapshotState, revision: int) -> bool:
    """Whether ``state`` can be reached at ``revision`` at all."""
    if state is P.PREPARED:
        return revision == 1
    if state is P.EXCHANGE_INTENT:
        return revision == 2
    if state is P.NOT_PUBLISHED:
        return revision >= 2
    return revision >= 3  # PUBLISHED, COMMIT_UNKNOWN


def transition_ok(
    current: SnapshotState | None, revision: int | None, target: SnapshotState, new_revision: int
) -> bool:
    """Whether ``current@revision -> target@new_revision`` is an allowed edge."""
    if current is None:  # nothing stored yet: there is no revision either
        return revision is None and target is P.PREPARED and new_revision == 1
    if revision is None or new_revision != revision + 1 or not revision_ok(current, revision):
        return False
    if current is P.PREPARED:
        return target in (P.EXCHANGE_INTENT, P.NOT_PUBLISHED)
    if current is P.EXCHANGE_INTENT:
        return target in (P.PUBLISHED, P.NOT_PUBLISHED, P.COMMIT_UNKNOWN)
    if current is P.COMMIT_UNKNOWN:
        return target in (P.PUBLISHED, P.NOT_PUBLISHED)
    return False  # PUBLISHED and NOT_PUBLISHED are terminal


def check_transition(
    current: SnapshotState | None, revision: int | None, target: SnapshotState, new_revision: int
) -> None:
    """Raise ``invalid_transition`` unless the edge is allowed."""
    if not transition_ok(current, revision, target, new_revision):
        was = "nothing" if current is None else f"{current.value}@{revision}"
        raise StateError(
            f"a snapshot record cannot move from {was} to {target.value}@{new_revision}",
            code="invalid_transition",
        )


def exchange_query_id(intent_sha256: str) -> str:
    """The one query id of an intent's EXCHANGE: ``dpone-s00-<intent[:32]>-exchange``."""
    return f"{QUERY_ID_PREFIX}-{intent_sha256[:32]}-exchange"


def exchange_session_id(intent_sha256: str) -> str:
    """The HTTP session that serves as the drain gate of an intent's EXCHANGE."""
    return f"{QUERY_ID_PREFIX}-{intent_sha256[:32]}-session"


def create_target_query_id(generation_ref: str) -> str:
    """First publication: the query id of the empty target's CREATE (one per generation)."""
    return f"{QUERY_ID_PREFIX}-{generation_ref[:32]}-create-target"


@dataclass(frozen=True)
class SnapshotLimits:
    """The six ceilings of a publication (bytes and rows; every value >= 0).

    The previous target A and every retained generation count toward
    ``retained_storage_bytes`` and ``total_transient_storage_bytes``.
    """

    source_rows: int
    source_bytes: int
    wire_bytes: int
    generation_storage_bytes: int
    retained_storage_bytes: int
    total_transient_storage_bytes: int

    def to_document(self) -> dict[str, Any]:
        """The canonical-JSON-ready document (the ``limits`` member of an intent)."""
        return {
            "source_rows": self.source_rows,
            "source_bytes": self.source_bytes,
            "wire_bytes": self.wire_bytes,
            "generation_storage_bytes": self.generation_storage_bytes,
            "retained_storage_bytes": self.retained_storage_bytes,
            "total_transient_storage_bytes": self.total_transient_storage_bytes,
        }

    @classmethod
    def from_document(cls, obj: Any, *, where: str = "limits") -> SnapshotLimits:
        """Parse the six ceilings; each must be a non-negative integer (not a boolean)."""
        names = (
            "source_rows",
            "source_bytes",
            "wire_bytes",
            "generation_storage_bytes",
            "retained_storage_bytes",
            "total_transient_storage_bytes",
        )
        fields = members(obj, dict.fromkeys(names, _COUNTER), where=where)
        values = {name: _counter(fields[name], where=f"{where}.{name}") for name in names}
        return cls(**values)


# Defaults in line with the staging policy's bounds (StagingPolicy): finite, generous.
DEFAULT_LIMITS = SnapshotLimits(
    source_rows=100_000_000,
    source_bytes=256 * 1024**3,
    wire_bytes=64 * 1024**3,
    generation_storage_bytes=64 * 1024**3,
    retained_storage_bytes=256 * 1024**3,
    total_transient_storage_bytes=512 * 1024**3,
)


@dataclass(frozen=True)
class IntentPrincipal:
    """An issued principal as bound in the intent (no credentials)."""

    user: str
    user_uuid: str
    lease_id: str


@dataclass(frozen=True)
class SnapshotIntent:
    """The immutable intent. ``sha256`` is the digest of the exact stored bytes.

    Document layout (every member required, no other member allowed)::

        {"kind": "dpone.snapshot-intent", "intent_version": 1,
         "parent_request": {"request_id": str},
         "attempt": {"attempt_id": str, "slot_epoch": int, "attempt_epoch": int},
         "protected": {"server_id": str, "server_id_source": str, "database": str,
                       "database_uuid": str, "target_table": str, "target_uuid": str},
         "generation": {"table": str, "table_uuid": str, "staged_event_sha256": str,
                        "semantic_id": str, "design_sha256": str},
         "source": {"receipt_sha256": str, "rows": int, "bytes": int,
                    "wire_bytes": int, "content_digest": str},
         "principals": {"ingest": {"user", "user_uuid", "lease_id"},
                        "publisher": {"user", "user_uuid", "lease_id"}},
         "limits": SnapshotLimits.to_document(),
         "prepared_at": str}
    """

    request_id: str
    attempt_id: str
    slot_epoch: int
    attempt_epoch: int
    server_id: str
    server_id_source: str
    database: str
    database_uuid: str
    target_table: str
    target_uuid: str  # A, observed at prepare (created empty first on a first publication)
    generation_table: str
    generation_uuid: str  # B
    staged_event_sha256: str
    semantic_id: str
    design_sha256: str
    receipt_sha256: str
    source_rows: int
    source_bytes: int
    wire_bytes: int
    content_digest: str  # B's order-independent digest (32 lowercase hex digits)
    ingest: IntentPrincipal
    publisher: IntentPrincipal
    limits: SnapshotLimits
    prepared_at: str
    raw: bytes = field(default=b"", repr=False)  # the exact canonical bytes parsed / stored
    sha256: str = ""  # SHA-256 of ``raw``

    def to_document(self) -> dict[str, Any]:
        """The document of the intent (``raw`` and ``sha256`` are not members)."""
        return {
            "kind": INTENT_KIND,
            "intent_version": INTENT_VERSION,
            "parent_request": {"request_id": self.request_id},
            "attempt": {
                "attempt_id": self.attempt_id,
                "slot_epoch": self.slot_epoch,
                "attempt_epoch": self.attempt_epoch,
            },
            "protected": {
                "server_id": self.server_id,
                "server_id_source": self.server_id_source,
                "database": self.database,
                "database_uuid": self.database_uuid,
                "target_table": self.target_table,
                "target_uuid": self.target_uuid,
            },
            "generation": {
                "table": self.generation_table,
                "table_uuid": self.generation_uuid,
                "staged_event_sha256": self.staged_event_sha256,
                "semantic_id": self.semantic_id,
                "design_sha256": self.design_sha256,
            },
            "source": {
                "receipt_sha256": self.receipt_sha256,
                "rows": self.source_rows,
                "bytes": self.source_bytes,
                "wire_bytes": self.wire_bytes,
                "content_digest": self.content_digest,
            },
            "principals": {
                "ingest": _principal_document(self.ingest),
                "publisher": _principal_document(self.publisher),
            },
            "limits": self.limits.to_document(),
            "prepared_at": self.prepared_at,
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes of the intent."""
        return canonical_json.dumps(self.to_document())

    def seal(self) -> SnapshotIntent:
        """This intent parsed back from its canonical bytes: every rule checked,
        ``raw`` and ``sha256`` set. The one way to build an intent from its fields."""
        return SnapshotIntent.from_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotIntent:
        """Parse exact canonical intent bytes; refuse anything else (see module doc)."""
        obj = canonical_json.loads(data, what="snapshot intent")
        doc = members(obj, _INTENT_SPEC, where="intent")
        _check_header(doc, "intent_version", INTENT_KIND, INTENT_VERSION, where="intent")
        parent = members(doc["parent_request"], {"request_id": str}, where="intent.parent_request")
        attempt = members(doc["attempt"], _ATTEMPT_SPEC, where="intent.attempt")
        protected = members(doc["protected"], _PROTECTED_SPEC, where="intent.protected")
        generation = members(doc["generation"], _GENERATION_SPEC, where="intent.generation")
        source = members(doc["source"], _SOURCE_SPEC, where="intent.source")
        principals = members(doc["principals"], _PRINCIPALS_SPEC, where="intent.principals")
        ingest = _principal(principals["ingest"], where="intent.principals.ingest")
        publisher = _principal(principals["publisher"], where="intent.principals.publisher")
        if (
            ingest.user == publisher.user
            or ingest.user_uuid == publisher.user_uuid
            or ingest.lease_id == publisher.lease_id
        ):
            raise DocumentError(
                "intent.principals: the ingest and publisher principals must be distinct users",
                code="principals_not_distinct",
                where="intent.principals",
            )
        intent = cls(
            request_id=_text(parent["request_id"], where="intent.parent_request.request_id"),
            attempt_id=_text(attempt["attempt_id"], where="intent.attempt.attempt_id"),
            slot_epoch=_counter(attempt["slot_epoch"], where="intent.attempt.slot_epoch"),
            attempt_epoch=_counter(attempt["attempt_epoch"], where="intent.attempt.attempt_epoch"),
            server_id=_text(protected["server_id"], where="intent.protected.server_id"),
            server_id_source=_text(
                protected["server_id_source"], where="intent.protected.server_id_source"
            ),
            database=_text(protected["database"], where="intent.protected.database"),
            database_uuid=_uuid(protected["database_uuid"], where="intent.protected.database_uuid"),
            target_table=_text(protected["target_table"], where="intent.protected.target_table"),
            target_uuid=_uuid(protected["target_uuid"], where="intent.protected.target_uuid"),
            generation_table=_text(generation["table"], where="intent.generation.table"),
            generation_uuid=_uuid(generation["table_uuid"], where="intent.generation.table_uuid"),
            staged_event_sha256=_sha256(
                generation["staged_event_sha256"], where="intent.generation.staged_event_sha256"
            ),
            semantic_id=_text(generation["semantic_id"], where="intent.generation.semantic_id"),
            design_sha256=_sha256(
                generation["design_sha256"], where="intent.generation.design_sha256"
            ),
            receipt_sha256=_sha256(source["receipt_sha256"], where="intent.source.receipt_sha256"),
            source_rows=_counter(source["rows"], where="intent.source.rows"),
            source_bytes=_counter(source["bytes"], where="intent.source.bytes"),
            wire_bytes=_counter(source["wire_bytes"], where="intent.source.wire_bytes"),
            content_digest=_content_digest(
                source["content_digest"], where="intent.source.content_digest"
            ),
            ingest=ingest,
            publisher=publisher,
            limits=SnapshotLimits.from_document(doc["limits"], where="intent.limits"),
            prepared_at=_timestamp(doc["prepared_at"], where="intent.prepared_at"),
            raw=bytes(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        if intent.target_uuid == intent.generation_uuid or intent.target_table == (
            intent.generation_table
        ):
            raise DocumentError(
                "intent: the target and the generation must be two different tables",
                code="invalid_document",
                where="intent.generation",
            )
        return intent


# ---------------------------------------------------------------------- the record


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


CLOSURE_STRENGTHS = frozenset({"revoked", "custodial"})
DISPATCH_OUTCOMES = frozenset({"acknowledged", "refused", "unknown", "not_sent"})
CANCELLED = "cancelled"


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
            "claim": None if self.claim is None else _asdict(self.claim),
            "closure": None if self.closure is None else _asdict(self.closure),
            "observation": None if self.observation is None else _asdict(self.observation),
            "dispatch": None if self.dispatch is None else _asdict(self.dispatch),
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
        _check_header(doc, "record_version", RECORD_KIND, RECORD_VERSION, where="record")
        try:
            state = SnapshotState(doc["state"])
        except ValueError as exc:
            raise DocumentError(
                f"record.state {doc['state']!r} is not a snapshot state",
                code="unknown_state",
                where="record.state",
            ) from exc
        revision = _counter(doc["revision"], where="record.revision")
        if revision < 1:
            raise DocumentError(
                "record.revision must be at least 1",
                code="invalid_counter",
                where="record.revision",
            )
        previous = doc["previous_record_sha256"]
        reason = doc["reason"]
        record = cls(
            intent_sha256=_sha256(doc["intent_sha256"], where="record.intent_sha256"),
            state=state,
            revision=revision,
            claim=None if doc["claim"] is None else _claim(doc["claim"]),
            closure=None if doc["closure"] is None else _closure(doc["closure"]),
            observation=None if doc["observation"] is None else _observation(doc["observation"]),
            dispatch=None if doc["dispatch"] is None else _dispatch(doc["dispatch"]),
            reason=None if reason is None else _text(reason, where="record.reason"),
            previous_record_sha256=(
                None
                if previous is None
                else _sha256(previous, where="record.previous_record_sha256")
            ),
            at=_timestamp(doc["at"], where="record.at"),
            raw=bytes(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        check_record_shape(record)
        return record


def check_record_shape(record: SnapshotRecord) -> None:
    """Refuse (``unreachable_state``) a record whose revision or members do not fit its state.

    PREPARED@1: nothing but the intent. EXCHANGE_INTENT@2: a claim, nothing observed yet.
    NOT_PUBLISHED@2: the cancellation (no claim, reason ``cancelled``). PUBLISHED and
    NOT_PUBLISHED@>=3: a claim, a proven closure and the observed UUID pair (PUBLISHED
    also B's rows and digest). COMMIT_UNKNOWN@>=3: a claim. Every record after the first
    names its predecessor.
    """
    state, revision = record.state, record.revision
    problems: list[str] = []
    if not revision_ok(state, revision):
        problems.append(f"revision {revision} is not reachable in this state")
    first = state is P.PREPARED
    if first != (record.previous_record_sha256 is None):
        problems.append("only the first record has no previous_record_sha256")
    cancelled = state is P.NOT_PUBLISHED and revision == 2
    if (record.reason == CANCELLED) != cancelled:
        problems.append(f"reason {CANCELLED!r} belongs to NOT_PUBLISHED@2 exactly")
    if first or cancelled:
        present = [
            name
            for name in ("claim", "closure", "observation", "dispatch", "reason")
            if getattr(record, name) is not None and not (cancelled and name == "reason")
        ]
        if present:
            problems.append(f"holds {', '.join(present)} although no claim was ever made")
    else:
        problems.extend(_claimed_shape(record))
    if problems:
        raise DocumentError(
            f"record {state.value}@{revision} is unreachable: {'; '.join(problems)}",
            code="unreachable_state",
            where="record",
            state=state.value,
            revision=revision,
        )


def _claimed_shape(record: SnapshotRecord) -> list[str]:
    problems: list[str] = []
    state = record.state
    if record.claim is None:
        problems.append("a claimed state needs its claim")
    if state is P.EXCHANGE_INTENT:
        present = [n for n in ("closure", "observation", "dispatch") if getattr(record, n)]
        if present:
            problems.append(f"holds {', '.join(present)} before any dispatch")
        return problems
    if state is P.COMMIT_UNKNOWN:
        return problems
    closure, seen = record.closure, record.observation
    if closure is None or not closure.proven:
        problems.append("a terminal state needs a proven publisher closure")
    if seen is None or seen.target_uuid is None or seen.generation_uuid is None:
        problems.append("a terminal state needs both observed UUIDs")
    elif state is P.PUBLISHED and (seen.target_rows is None or seen.target_content_digest is None):
        problems.append("PUBLISHED needs B's observed rows and content digest")
    return problems


# ---------------------------------------------------------------------- reconcile


@dataclass(frozen=True)
class ReconcileFacts:
    """What one reconcile established; None means "not observed" (absent or unobservable).

    ``dispatch_outcome`` is the DispatchOutcome value this process got from its own
    EXCHANGE, if it sent one in this call (a crash leaves none).
    """

    closure_proven: bool
    target_uuid: str | None
    generation_uuid: str | None
    target_rows: int | None
    target_content_digest: str | None
    exchange_finishes: int | None
    dispatch_outcome: str | None = None

    def observation(self) -> RecordObservation:
        """The facts as a record's ``observation`` member."""
        return RecordObservation(
            target_uuid=self.target_uuid,
            generation_uuid=self.generation_uuid,
            target_rows=self.target_rows,
            target_content_digest=self.target_content_digest,
            exchange_finishes=self.exchange_finishes,
        )


def decide_reconcile(intent: SnapshotIntent, facts: ReconcileFacts) -> SnapshotState:
    """The state the facts prove: PUBLISHED, NOT_PUBLISHED, or else COMMIT_UNKNOWN.

    PUBLISHED: closure proven, the target name holds B, the generation name holds A, and
    the target's rows and content digest equal the source's. NOT_PUBLISHED: closure
    proven, the names still hold A and B, and the EXCHANGE provably never ran (the query
    log, observable, has no QueryFinish for its id; or this process's own dispatch was
    refused or never sent, and the log shows no finish). An A/B pair with a logged finish
    may be a double exchange (a reused query id runs again): unknown.
    """
    if not facts.closure_proven:
        return P.COMMIT_UNKNOWN
    a, b = intent.target_uuid, intent.generation_uuid
    if (facts.target_uuid, facts.generation_uuid) == (b, a):
        parity = (
            facts.target_rows == intent.source_rows
            and facts.target_content_digest == intent.content_digest
        )
        return P.PUBLISHED if parity else P.COMMIT_UNKNOWN
    if (facts.target_uuid, facts.generation_uuid) == (a, b):
        log_says_never = facts.exchange_finishes == 0
        answer_says_never = facts.dispatch_outcome in ("refused", "not_sent") and (
            facts.exchange_finishes in (None, 0)
        )
        if log_says_never or answer_says_never:
            return P.NOT_PUBLISHED
    return P.COMMIT_UNKNOWN


# ---------------------------------------------------------------------- parsing helpers

# Counters are declared as int-or-bool so that :func:`_counter` (not ``members``) owns
# the refusal of a boolean and reports it as ``invalid_counter``.
_COUNTER: MemberType = (int, bool)
_NULLABLE_TEXT: MemberType = (str, type(None))
_NULLABLE_COUNTER: MemberType = (int, bool, type(None))
_OBJECT_OR_NULL: MemberType = (dict, type(None))
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTENT_DIGEST = re.compile(r"[0-9a-f]{32}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NIL_UUID = "00000000-0000-0000-0000-000000000000"
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|\+00:00)")

_INTENT_SPEC: dict[str, MemberType] = {
    "kind": str,
    "intent_version": _COUNTER,
    "parent_request": dict,
    "attempt": dict,
    "protected": dict,
    "generation": dict,
    "source": dict,
    "principals": dict,
    "limits": dict,
    "prepared_at": str,
}
_ATTEMPT_SPEC: dict[str, MemberType] = {
    "attempt_id": str,
    "slot_epoch": _COUNTER,
    "attempt_epoch": _COUNTER,
}
_PROTECTED_SPEC: dict[str, MemberType] = {
    "server_id": str,
    "server_id_source": str,
    "database": str,
    "database_uuid": str,
    "target_table": str,
    "target_uuid": str,
}
_GENERATION_SPEC: dict[str, MemberType] = {
    "table": str,
    "table_uuid": str,
    "staged_event_sha256": str,
    "semantic_id": str,
    "design_sha256": str,
}
_SOURCE_SPEC: dict[str, MemberType] = {
    "receipt_sha256": str,
    "rows": _COUNTER,
    "bytes": _COUNTER,
    "wire_bytes": _COUNTER,
    "content_digest": str,
}
_PRINCIPALS_SPEC: dict[str, MemberType] = {"ingest": dict, "publisher": dict}
_PRINCIPAL_SPEC: dict[str, MemberType] = {"user": str, "user_uuid": str, "lease_id": str}
_RECORD_SPEC: dict[str, MemberType] = {
    "kind": str,
    "record_version": _COUNTER,
    "intent_sha256": str,
    "state": str,
    "revision": _COUNTER,
    "claim": _OBJECT_OR_NULL,
    "closure": _OBJECT_OR_NULL,
    "observation": _OBJECT_OR_NULL,
    "dispatch": _OBJECT_OR_NULL,
    "reason": _NULLABLE_TEXT,
    "previous_record_sha256": _NULLABLE_TEXT,
    "at": str,
}
_CLAIM_SPEC: dict[str, MemberType] = {"claim_id": str, "claimed_at": str}
_CLOSURE_SPEC: dict[str, MemberType] = {"strength": str, "proven": bool, "lease_id": str}
_OBSERVATION_SPEC: dict[str, MemberType] = {
    "target_uuid": _NULLABLE_TEXT,
    "generation_uuid": _NULLABLE_TEXT,
    "target_rows": _NULLABLE_COUNTER,
    "target_content_digest": _NULLABLE_TEXT,
    "exchange_finishes": _NULLABLE_COUNTER,
}
_DISPATCH_SPEC: dict[str, MemberType] = {
    "query_id": str,
    "session_id": _NULLABLE_TEXT,
    "outcome": str,
    "clickhouse_code": _NULLABLE_COUNTER,
}


def _check_header(
    doc: Mapping[str, Any], version_key: str, kind: str, version: int, *, where: str
) -> None:
    if doc["kind"] != kind or isinstance(doc[version_key], bool) or doc[version_key] != version:
        raise DocumentError(
            f"{where} is not a {kind} version {version} document",
            code="unsupported_version",
            where=where,
        )


def _counter(value: Any, *, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DocumentError(
            f"{where} must be a non-negative integer, not {value!r}",
            code="invalid_counter",
            where=where,
        )
    return value


def _text(value: str, *, where: str) -> str:
    if not value:
        raise DocumentError(f"{where} must not be empty", code="invalid_document", where=where)
    return value


def _sha256(value: str, *, where: str) -> str:
    if _SHA256.fullmatch(value) is None:
        raise DocumentError(
            f"{where} must be 64 lowercase hex digits", code="invalid_digest", where=where
        )
    return value


def _content_digest(value: str, *, where: str) -> str:
    if _CONTENT_DIGEST.fullmatch(value) is None:
        raise DocumentError(
            f"{where} must be 32 lowercase hex digits", code="invalid_digest", where=where
        )
    return value


def _uuid(value: str, *, where: str) -> str:
    # A Nil UUID is what a non-Atomic database shows: it identifies nothing.
    if _UUID.fullmatch(value) is None or value == _NIL_UUID:
        raise DocumentError(
            f"{where} must be a lowercase, non-nil UUID", code="invalid_uuid", where=where
        )
    return value


def _timestamp(value: str, *, where: str) -> str:
    valid = _TIMESTAMP.fullmatch(value) is not None
    if valid:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            valid = False
    if not valid:
        raise DocumentError(
            f"{where} must be a UTC ISO 8601 time, not {value!r}",
            code="invalid_timestamp",
            where=where,
        )
    return value


def _principal(obj: Any, *, where: str) -> IntentPrincipal:
    fields = members(obj, _PRINCIPAL_SPEC, where=where)
    return IntentPrincipal(
        user=_text(fields["user"], where=f"{where}.user"),
        user_uuid=_uuid(fields["user_uuid"], where=f"{where}.user_uuid"),
        lease_id=_text(fields["lease_id"], where=f"{where}.lease_id"),
    )


def _principal_document(principal: IntentPrincipal) -> dict[str, Any]:
    return {
        "user": principal.user,
        "user_uuid": principal.user_uuid,
        "lease_id": principal.lease_id,
    }


def _claim(obj: Any) -> RecordClaim:
    fields = members(obj, _CLAIM_SPEC, where="record.claim")
    return RecordClaim(
        claim_id=_text(fields["claim_id"], where="record.claim.claim_id"),
        claimed_at=_timestamp(fields["claimed_at"], where="record.claim.claimed_at"),
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
        lease_id=_text(fields["lease_id"], where="record.closure.lease_id"),
    )


def _observation(obj: Any) -> RecordObservation:
    where = "record.observation"
    fields = members(obj, _OBSERVATION_SPEC, where=where)
    target, generation = fields["target_uuid"], fields["generation_uuid"]
    rows, digest = fields["target_rows"], fields["target_content_digest"]
    finishes = fields["exchange_finishes"]
    return RecordObservation(
        target_uuid=None if target is None else _uuid(target, where=f"{where}.target_uuid"),
        generation_uuid=(
            None if generation is None else _uuid(generation, where=f"{where}.generation_uuid")
        ),
        target_rows=None if rows is None else _counter(rows, where=f"{where}.target_rows"),
        target_content_digest=(
            None
            if digest is None
            else _content_digest(digest, where=f"{where}.target_content_digest")
        ),
        exchange_finishes=(
            None if finishes is None else _counter(finishes, where=f"{where}.exchange_finishes")
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
        query_id=_text(fields["query_id"], where=f"{where}.query_id"),
        session_id=None if session is None else _text(session, where=f"{where}.session_id"),
        outcome=fields["outcome"],
        clickhouse_code=None if code is None else _counter(code, where=f"{where}.clickhouse_code"),
    )


def _asdict(
    value: RecordClaim | RecordClosure | RecordObservation | RecordDispatch,
) -> dict[str, Any]:
    return dict(vars(value))
