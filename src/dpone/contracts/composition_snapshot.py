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
from dataclasses import dataclass
from typing import Any

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
    if current is None:
        return target is P.PREPARED and new_revision == 1
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
        return {
            "source_rows": self.source_rows,
            "source_bytes": self.source_bytes,
            "wire_bytes": self.wire_bytes,
            "generation_storage_bytes": self.generation_storage_bytes,
            "retained_storage_bytes": self.retained_storage_bytes,
            "total_transient_storage_bytes": self.total_transient_storage_bytes,
        }


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
    raw: bytes = b""  # the exact canonical bytes this intent was parsed from / stored as
    sha256: str = ""  # SHA-256 of ``raw``


# The record (SnapshotRecord), the strict parsers (from_bytes), to_bytes and the
# reconcile decision are completed in this module; see issue 10.
