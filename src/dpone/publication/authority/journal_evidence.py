"""Reading a staging journal's evidence for the authority's ``reopen``.

Every inconsistency is an :class:`AuthorityError` with code ``evidence_unverified`` and
``details.reason`` naming what was wrong and where.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from dpone.contracts import canonical_json
from dpone.contracts.receipt import FileReceipt
from dpone.errors import DponeError, StateError
from dpone.ports.composition_snapshot import GenerationEvidence
from dpone.staging.journal import JournalEvent

_DIGEST = re.compile(r"^[0-9a-f]{32}$")


class AuthorityError(StateError):
    """The authority refused (see ``code``: evidence_unverified, attempt_fenced, ...)."""

    code = "authority_error"


def unverified(message: str, reason: str, **details: Any) -> AuthorityError:
    """An ``evidence_unverified`` refusal with its reason."""
    return AuthorityError(message, code="evidence_unverified", reason=reason, **details)


def journal_member(doc: Mapping[str, Any], name: str, kind: type, where: Mapping[str, Any]) -> Any:
    """Member ``name`` of an event document, of type ``kind`` (refused otherwise)."""
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise unverified(
            f"event member {name} is missing or not a {kind.__name__}",
            f"{name}_missing",
            member=name,
            **where,
        )
    return value


def one_event(events: list[JournalEvent], outcome: str, where: Mapping[str, Any]) -> JournalEvent:
    """The one event with ``outcome`` (refused unless exactly one)."""
    found = [e for e in events if e.document.get("outcome") == outcome]
    if len(found) != 1:
        raise unverified(
            f"the journal has {len(found)} {outcome} events, not one",
            f"{outcome}_event_missing",
            **where,
        )
    return found[0]


def journal_receipt(
    events: list[JournalEvent], where: Mapping[str, Any]
) -> tuple[FileReceipt, str]:
    """The receipt the admitted event binds, in canonical bytes, and its digest."""
    admitted = one_event(events, "admitted", where)
    data = canonical_json.dumps(journal_member(admitted.document, "source_identity", dict, where))
    try:
        receipt = FileReceipt.from_bytes(data)
    except DponeError as exc:
        raise unverified(
            f"the receipt does not parse: {exc.message}", "receipt_invalid", cause=exc.code, **where
        ) from exc
    if receipt.to_bytes() != data:
        raise unverified("the receipt is not in its canonical form", "receipt_invalid", **where)
    return receipt, hashlib.sha256(data).hexdigest()


def generation_evidence(
    events: list[JournalEvent], final: JournalEvent, receipt_sha: str, where: Mapping[str, Any]
) -> GenerationEvidence:
    """The generation the staged event names, checked against its derived identity."""
    identity = journal_member(
        one_event(events, "prepared", where).document, "derived_identity", dict, where
    )
    doc = final.document
    semantic_id = journal_member(doc, "semantic_id", str, where)
    if canonical_json.sha256_hex(identity) != semantic_id:
        raise unverified(
            "the semantic id is not the derived identity's digest", "semantic_id_mismatch", **where
        )
    if identity.get("source_receipt_sha256") != receipt_sha:
        raise unverified("the derived identity names another receipt", "receipt_mismatch", **where)
    rows_digest = identity.get("rows_digest")
    if not isinstance(rows_digest, str) or not _DIGEST.fullmatch(rows_digest):
        raise unverified(
            "the derived identity has no rows_digest (32 hex digits)",
            "rows_digest_missing",
            **where,
        )
    counts = journal_member(doc, "counts", dict, where)
    rows = identity.get("prepared_rows")
    rowbinary_bytes = identity.get("rowbinary_bytes")
    if not (
        isinstance(rows, int)
        and isinstance(rowbinary_bytes, int)
        and counts.get("prepared_rows") == rows == counts.get("observed_count")
    ):
        raise unverified(
            f"staging counted {counts}, prepared {rows} rows", "count_mismatch", **where
        )
    planned = journal_member(doc, "planned_ownership", dict, where)
    observed = journal_member(doc, "observed_ownership", dict, where)
    table, table_uuid = planned.get("table"), observed.get("table_uuid")
    if not isinstance(table, str) or not isinstance(table_uuid, str) or not table_uuid:
        raise unverified("the staged event names no table and UUID", "generation_missing", **where)
    return GenerationEvidence(
        table=table,
        table_uuid=table_uuid,
        staged_event_sha256=final.sha256,
        semantic_id=semantic_id,
        rows=rows,
        rowbinary_bytes=rowbinary_bytes,
        rows_digest=rows_digest,
    )
