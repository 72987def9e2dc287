"""The immutable intent of one publication and the principals it binds.

The intent binds everything a publication depends on; ``sha256`` is the digest of the
exact canonical bytes that were stored, never of a re-serialisation.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot.checks import (
    COUNTER,
    check_content_digest,
    check_counter,
    check_header,
    check_sha256,
    check_text,
    check_timestamp,
    check_uuid,
)
from dpone.contracts.composition_snapshot.limits import SnapshotLimits
from dpone.contracts.fields import DocumentError, MemberType, members

INTENT_KIND = "dpone.snapshot-intent"
INTENT_VERSION = 1


@dataclass(frozen=True)
class PrincipalIdentity:
    """A ClickHouse principal as documents name it: user, ``system.users.id``, lease.

    The one shape of the ``{"user", "user_uuid", "lease_id"}`` document; the intent's
    :class:`IntentPrincipal` and the ports' ``PrincipalRef`` are this shape.
    """

    user: str
    user_uuid: str
    lease_id: str

    def to_document(self) -> dict[str, Any]:
        """The canonical-JSON-ready document of the principal."""
        return {"user": self.user, "user_uuid": self.user_uuid, "lease_id": self.lease_id}


@dataclass(frozen=True)
class IntentPrincipal(PrincipalIdentity):
    """An issued principal as bound in the intent (no credentials)."""


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
        doc: dict[str, Any] = {"kind": INTENT_KIND, "intent_version": INTENT_VERSION}
        for section, layout in _SECTIONS.items():
            doc[section] = {m.name: getattr(self, m.attribute) for m in layout}
        doc["principals"] = {
            "ingest": self.ingest.to_document(),
            "publisher": self.publisher.to_document(),
        }
        doc["limits"] = self.limits.to_document()
        doc["prepared_at"] = self.prepared_at
        return doc

    def to_bytes(self) -> bytes:
        """The canonical bytes of the intent."""
        return canonical_json.dumps(self.to_document())

    def seal(self) -> SnapshotIntent:
        """This intent parsed back from its canonical bytes: every rule checked,
        ``raw`` and ``sha256`` set. The one way to build an intent from its fields."""
        return SnapshotIntent.from_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotIntent:
        """Parse exact canonical intent bytes; refuse anything else (see class doc).

        The same bytes always parse to the same immutable intent, so the last
        :data:`PARSED_INTENTS_KEPT` parses are kept: a store's listing, read at each
        observation, costs its own parse once per process, not once per read.
        """
        return _parsed_intent(bytes(data))

    @classmethod
    def _parse(cls, data: bytes) -> SnapshotIntent:
        obj = canonical_json.loads(data, what="snapshot intent")
        doc = members(obj, _INTENT_SPEC, where="intent")
        check_header(doc, "intent_version", INTENT_KIND, INTENT_VERSION, where="intent")
        # Every section's members first, then the principals, then the values: the order
        # in which a document with several faults reports the first one.
        sections = {
            section: members(doc[section], _spec(layout), where=f"intent.{section}")
            for section, layout in _SECTIONS.items()
        }
        principals = members(doc["principals"], _PRINCIPALS_SPEC, where="intent.principals")
        ingest = _principal(principals["ingest"], where="intent.principals.ingest")
        publisher = _principal(principals["publisher"], where="intent.principals.publisher")
        _check_distinct(ingest, publisher)
        values = {
            m.attribute: m.check(sections[section][m.name], where=f"intent.{section}.{m.name}")
            for section, layout in _SECTIONS.items()
            for m in layout
        }
        intent = cls(
            **values,
            ingest=ingest,
            publisher=publisher,
            limits=SnapshotLimits.from_document(doc["limits"], where="intent.limits"),
            prepared_at=check_timestamp(doc["prepared_at"], where="intent.prepared_at"),
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


# A refused document is never kept: its error is raised again at every parse.
PARSED_INTENTS_KEPT = 4096


@functools.lru_cache(maxsize=PARSED_INTENTS_KEPT)
def _parsed_intent(data: bytes) -> SnapshotIntent:
    return SnapshotIntent._parse(data)


class _Check(Protocol):
    def __call__(self, value: Any, *, where: str) -> Any: ...


class _Member(NamedTuple):
    """One member of an intent section: its name, its check, the field it fills."""

    name: str
    check: _Check
    into: str = ""  # the SnapshotIntent field it fills, where that is not ``name``

    @property
    def attribute(self) -> str:
        """The SnapshotIntent field the member fills."""
        return self.into or self.name


# The sections of the intent, members in document order: to_document writes them and
# from_bytes reads and checks them from this one table.
_SECTIONS: dict[str, tuple[_Member, ...]] = {
    "parent_request": (_Member("request_id", check_text),),
    "attempt": (
        _Member("attempt_id", check_text),
        _Member("slot_epoch", check_counter),
        _Member("attempt_epoch", check_counter),
    ),
    "protected": (
        _Member("server_id", check_text),
        _Member("server_id_source", check_text),
        _Member("database", check_text),
        _Member("database_uuid", check_uuid),
        _Member("target_table", check_text),
        _Member("target_uuid", check_uuid),
    ),
    "generation": (
        _Member("table", check_text, "generation_table"),
        _Member("table_uuid", check_uuid, "generation_uuid"),
        _Member("staged_event_sha256", check_sha256),
        _Member("semantic_id", check_text),
        _Member("design_sha256", check_sha256),
    ),
    "source": (
        _Member("receipt_sha256", check_sha256),
        _Member("rows", check_counter, "source_rows"),
        _Member("bytes", check_counter, "source_bytes"),
        _Member("wire_bytes", check_counter),
        _Member("content_digest", check_content_digest),
    ),
}


def _spec(layout: tuple[_Member, ...]) -> dict[str, MemberType]:
    # Every member of a section is text except the counters.
    return {m.name: COUNTER if m.check is check_counter else str for m in layout}


_INTENT_SPEC: dict[str, MemberType] = {
    "kind": str,
    "intent_version": COUNTER,
    **dict.fromkeys(_SECTIONS, dict),
    "principals": dict,
    "limits": dict,
    "prepared_at": str,
}
_PRINCIPALS_SPEC: dict[str, MemberType] = {"ingest": dict, "publisher": dict}
_PRINCIPAL_SPEC: dict[str, MemberType] = {"user": str, "user_uuid": str, "lease_id": str}


def _principal(obj: Any, *, where: str) -> IntentPrincipal:
    fields = members(obj, _PRINCIPAL_SPEC, where=where)
    return IntentPrincipal(
        user=check_text(fields["user"], where=f"{where}.user"),
        user_uuid=check_uuid(fields["user_uuid"], where=f"{where}.user_uuid"),
        lease_id=check_text(fields["lease_id"], where=f"{where}.lease_id"),
    )


def _check_distinct(ingest: IntentPrincipal, publisher: IntentPrincipal) -> None:
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
