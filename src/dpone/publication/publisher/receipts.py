"""What a publisher call answers: its receipt, its error, and the clock the documents use."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dpone.contracts.composition_snapshot import ReconcileFacts, SnapshotRecord, SnapshotState
from dpone.errors import StateError


class SnapshotPublicationError(StateError):
    """A publication step was refused or its outcome is not known (see ``code``)."""

    code = "publication_error"


def utc_now() -> str:
    """The current UTC time as the documents write it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class PublicationReceipt:
    """What one call established: the record it reached and what was observed.

    ``historical``: a replay of a terminal record's own observation, not a claim
    about the target today. Otherwise the UUIDs, rows and digest are this call's
    observation (None where it could not observe).
    """

    state: SnapshotState
    revision: int
    intent_sha256: str
    record_bytes: bytes
    record_sha256: str
    target_uuid: str | None
    generation_uuid: str | None
    target_rows: int | None
    target_content_digest: str | None
    historical: bool

    def to_document(self) -> dict[str, Any]:
        """A JSON-ready description (without the record bytes)."""
        return {
            "state": self.state.value,
            "revision": self.revision,
            "intent_sha256": self.intent_sha256,
            "record_sha256": self.record_sha256,
            "target_uuid": self.target_uuid,
            "generation_uuid": self.generation_uuid,
            "target_rows": self.target_rows,
            "target_content_digest": self.target_content_digest,
            "historical": self.historical,
        }


def receipt(
    record: SnapshotRecord,
    target_uuid: str | None,
    generation_uuid: str | None,
    rows: int | None,
    digest: str | None,
    *,
    historical: bool,
) -> PublicationReceipt:
    """The receipt of ``record`` with what was observed of the target and the generation."""
    return PublicationReceipt(
        state=record.state,
        revision=record.revision,
        intent_sha256=record.intent_sha256,
        record_bytes=record.raw,
        record_sha256=record.sha256,
        target_uuid=target_uuid,
        generation_uuid=generation_uuid,
        target_rows=rows,
        target_content_digest=digest,
        historical=historical,
    )


def receipt_observed(record: SnapshotRecord, facts: ReconcileFacts) -> PublicationReceipt:
    """The receipt of ``record`` with this call's own observation ``facts``."""
    return receipt(
        record,
        facts.target_uuid,
        facts.generation_uuid,
        facts.target_rows,
        facts.target_content_digest,
        historical=False,
    )


def receipt_from_record(record: SnapshotRecord, *, historical: bool) -> PublicationReceipt:
    """The receipt of ``record`` with the observation the record itself holds (if any)."""
    seen = record.observation
    if seen is None:
        return receipt(record, None, None, None, None, historical=historical)
    return receipt(
        record,
        seen.target_uuid,
        seen.generation_uuid,
        seen.target_rows,
        seen.target_content_digest,
        historical=historical,
    )


def historical_receipt(record: SnapshotRecord) -> PublicationReceipt:
    """A replay of a terminal record: its own observation, not the target today."""
    return receipt_from_record(record, historical=True)
