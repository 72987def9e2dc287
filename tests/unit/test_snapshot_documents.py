"""Strict parsing of the publication documents: the intent, the record and the limits."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpone.contracts import canonical_json
from dpone.contracts.composition_snapshot import (
    SnapshotIntent,
    SnapshotLimits,
    SnapshotRecord,
    SnapshotState,
)
from dpone.errors import DponeError

P = SnapshotState
AT = "2024-05-01T12:00:00.123456Z"
A = "aaaaaaaa-0000-4000-8000-00000000000a"
B = "bbbbbbbb-0000-4000-8000-00000000000b"
SHA = "5" * 64


def intent_document() -> dict[str, Any]:
    return {
        "kind": "dpone.snapshot-intent",
        "intent_version": 1,
        "parent_request": {"request_id": "req-1"},
        "attempt": {"attempt_id": "attempt-1", "slot_epoch": 3, "attempt_epoch": 7},
        "protected": {
            "server_id": "server-1",
            "server_id_source": "dpone_identity",
            "database": "dpone_pub",
            "database_uuid": "dddddddd-0000-4000-8000-00000000000d",
            "target_table": "orders",
            "target_uuid": A,
        },
        "generation": {
            "table": "dpone_stage_orders",
            "table_uuid": B,
            "staged_event_sha256": "1" * 64,
            "semantic_id": "sémantique",
            "design_sha256": "2" * 64,
        },
        "source": {
            "receipt_sha256": "3" * 64,
            "rows": 10,
            "bytes": 100,
            "wire_bytes": 90,
            "content_digest": "4" * 32,
        },
        "principals": {
            "ingest": {
                "user": "dpone_ingest_1",
                "user_uuid": "eeeeeeee-0000-4000-8000-00000000000e",
                "lease_id": "lease-1",
            },
            "publisher": {
                "user": "dpone_publisher_1",
                "user_uuid": "ffffffff-0000-4000-8000-00000000000f",
                "lease_id": "lease-2",
            },
        },
        "limits": {
            "source_rows": 100,
            "source_bytes": 1000,
            "wire_bytes": 1000,
            "generation_storage_bytes": 1000,
            "retained_storage_bytes": 1000,
            "total_transient_storage_bytes": 2000,
        },
        "prepared_at": AT,
    }


CLOSURE = {"strength": "custodial", "proven": True, "lease_id": "lease-2"}
OBSERVATION = {
    "target_uuid": B,
    "generation_uuid": A,
    "target_rows": 10,
    "target_content_digest": "4" * 32,
    "exchange_finishes": 1,
}


def record_document(state: SnapshotState, revision: int) -> dict[str, Any]:
    """A well-formed record of ``state`` (the shape the state needs) at ``revision``."""
    claimed = state is not P.PREPARED and not (state is P.NOT_PUBLISHED and revision == 2)
    terminal = state in (P.PUBLISHED, P.NOT_PUBLISHED) and claimed
    return {
        "kind": "dpone.snapshot-record",
        "record_version": 1,
        "intent_sha256": SHA,
        "state": state.value,
        "revision": revision,
        "claim": {"claim_id": "c-1", "claimed_at": AT} if claimed else None,
        "closure": copy.deepcopy(CLOSURE) if terminal else None,
        "observation": copy.deepcopy(OBSERVATION) if terminal else None,
        "dispatch": None,
        "reason": "cancelled" if state is P.NOT_PUBLISHED and revision == 2 else None,
        "previous_record_sha256": None if state is P.PREPARED else "6" * 64,
        "at": AT,
    }


def code_of(data: bytes, parse: Any) -> str | None:
    try:
        parse(data)
    except DponeError as exc:
        return exc.code
    return None


def dumps(doc: Any) -> bytes:
    return canonical_json.dumps(doc)


# ---------------------------------------------------------------------- intent


def test_intent_round_trip_keeps_exact_bytes_and_digest() -> None:
    data = dumps(intent_document())
    intent = SnapshotIntent.from_bytes(data)
    assert (intent.raw, intent.to_bytes()) == (data, data)
    assert intent.sha256 == hashlib.sha256(data).hexdigest()
    assert (intent.target_uuid, intent.generation_uuid, intent.slot_epoch) == (A, B, 3)
    assert intent.limits == SnapshotLimits(100, 1000, 1000, 1000, 1000, 2000)
    rebuilt = SnapshotIntent(**{**intent.__dict__, "raw": b"", "sha256": ""}).seal()
    assert (rebuilt.raw, rebuilt.sha256) == (data, intent.sha256)


def test_a_parsed_intent_is_kept_and_a_refused_one_refused_again() -> None:
    data = dumps(intent_document())
    first = SnapshotIntent.from_bytes(data)
    # The same bytes (another object, as a store read returns them): the same intent.
    assert SnapshotIntent.from_bytes(bytes(bytearray(data))) is first
    doc = intent_document()
    doc["attempt"]["slot_epoch"] = -1
    bad = dumps(doc)
    refused = code_of(bad, SnapshotIntent.from_bytes)
    assert refused is not None
    assert code_of(bad, SnapshotIntent.from_bytes) == refused  # never kept: raised again


def _paths(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in doc.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out.extend(_paths(value, (*prefix, key)))
    return out


INTENT_PATHS = _paths(intent_document())


def _parent(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path[:-1]:
        doc = doc[key]
    return doc


@pytest.mark.parametrize("path", INTENT_PATHS, ids=".".join)
def test_intent_refuses_each_missing_member(path: tuple[str, ...]) -> None:
    doc = intent_document()
    del _parent(doc, path)[path[-1]]
    assert code_of(dumps(doc), SnapshotIntent.from_bytes) == "missing_member"


OBJECTS = [p for p in INTENT_PATHS if isinstance(_parent(intent_document(), p)[p[-1]], dict)]


@pytest.mark.parametrize("path", [("extra",), *((*p, "extra") for p in OBJECTS)], ids=".".join)
def test_intent_refuses_each_unknown_member(path: tuple[str, ...]) -> None:
    doc = intent_document()
    _parent(doc, path)[path[-1]] = 1
    assert code_of(dumps(doc), SnapshotIntent.from_bytes) == "unknown_member"


COUNTERS = [p for p in INTENT_PATHS if isinstance(_parent(intent_document(), p)[p[-1]], int)]


@pytest.mark.parametrize("path", COUNTERS, ids=".".join)
@pytest.mark.parametrize("bad", [-1, True, False])
def test_intent_refuses_negative_or_boolean_counters(path: tuple[str, ...], bad: Any) -> None:
    doc = intent_document()
    _parent(doc, path)[path[-1]] = bad
    expected = "unsupported_version" if path == ("intent_version",) else "invalid_counter"
    assert code_of(dumps(doc), SnapshotIntent.from_bytes) == expected


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        (("generation", "staged_event_sha256"), "1" * 63, "invalid_digest"),
        (("source", "receipt_sha256"), "A" * 64, "invalid_digest"),
        (("generation", "design_sha256"), "2" * 65, "invalid_digest"),
        (("source", "content_digest"), "4" * 64, "invalid_digest"),
        (("protected", "target_uuid"), A.upper(), "invalid_uuid"),
        (("protected", "target_uuid"), "00000000-0000-0000-0000-000000000000", "invalid_uuid"),
        (("generation", "table_uuid"), "not-a-uuid", "invalid_uuid"),
        (("protected", "database_uuid"), A.replace("-", ""), "invalid_uuid"),
        (("principals", "ingest", "user_uuid"), "x", "invalid_uuid"),
        (("generation", "table_uuid"), A, "invalid_document"),  # B would be A
        (("prepared_at",), "2024-05-01 12:00:00", "invalid_timestamp"),
        (("prepared_at",), "2024-13-01T12:00:00Z", "invalid_timestamp"),
        (("prepared_at",), "2024-05-01T12:00:00+02:00", "invalid_timestamp"),
        (("kind",), "dpone.snapshot-record", "unsupported_version"),
        (("intent_version",), 2, "unsupported_version"),
        (("attempt", "slot_epoch"), "3", "wrong_type"),
        (("protected", "database"), 5, "wrong_type"),
        (("parent_request", "request_id"), "", "invalid_document"),
        (("principals", "publisher", "user"), "dpone_ingest_1", "principals_not_distinct"),
        (
            ("principals", "publisher", "user_uuid"),
            "eeeeeeee-0000-4000-8000-00000000000e",
            "principals_not_distinct",
        ),
        (("principals", "publisher", "lease_id"), "lease-1", "principals_not_distinct"),
    ],
)
def test_intent_refuses_malformed_values(path: tuple[str, ...], value: Any, code: str) -> None:
    doc = intent_document()
    _parent(doc, path)[path[-1]] = value
    assert code_of(dumps(doc), SnapshotIntent.from_bytes) == code


NONCANONICAL = [
    lambda doc: json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False).encode(),
    lambda doc: json.dumps(doc, sort_keys=True, ensure_ascii=False).encode(),  # ", " and ": "
    lambda doc: json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(),  # \\u escapes
    lambda doc: json.dumps(
        dict(reversed(list(doc.items()))), separators=(",", ":"), ensure_ascii=False
    ).encode(),
    lambda doc: dumps(doc) + b"\n",
    lambda doc: b"\xef\xbb\xbf" + dumps(doc),
    lambda doc: b" " + dumps(doc),
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NONCANONICAL), st.sampled_from(["intent", *P]), st.integers(1, 6))
def test_noncanonical_bytes_are_refused(
    spell: Any, which: str | SnapshotState, revision: int
) -> None:
    doc: dict[str, Any]
    parse: Any
    if which == "intent":
        doc, parse = intent_document(), SnapshotIntent.from_bytes
    else:
        assert isinstance(which, SnapshotState)
        doc, parse = record_document(which, revision), SnapshotRecord.from_bytes
    data = spell(doc)
    assume(data != dumps(doc))  # \u escapes change nothing in a pure-ASCII record
    assert code_of(data, parse) == "noncanonical_json"


@pytest.mark.parametrize(
    "needle",
    [
        '"kind":',
        '"attempt_epoch":',
        '"user":"dpone_publisher_1"',
        '"total_transient_storage_bytes":',
    ],
)
def test_intent_refuses_duplicate_members(needle: str) -> None:
    text = dumps(intent_document()).decode()
    start = text.index(needle)
    end = (
        text.index(",", start)
        if needle != '"total_transient_storage_bytes":'
        else text.index("}", start)
    )
    member = text[start:end]
    data = (text[:start] + member + "," + text[start:]).encode()
    assert code_of(data, SnapshotIntent.from_bytes) == "duplicate_member"


# ---------------------------------------------------------------------- record


def _reachable(doc: dict[str, Any]) -> bool:
    """The seed's shapes, restated: what each state must and must not carry."""
    state, revision = SnapshotState(doc["state"]), doc["revision"]
    claim, closure, seen = doc["claim"], doc["closure"], doc["observation"]
    nothing_claimed = claim is None and closure is None and seen is None and doc["dispatch"] is None
    if state is P.PREPARED:
        return (
            revision == 1
            and nothing_claimed
            and doc["reason"] is None
            and doc["previous_record_sha256"] is None
        )
    if doc["previous_record_sha256"] is None:
        return False
    if state is P.NOT_PUBLISHED and revision == 2:
        return nothing_claimed and doc["reason"] == "cancelled"
    if doc["reason"] == "cancelled" or claim is None:
        return False
    if state is P.EXCHANGE_INTENT:
        return revision == 2 and closure is None and seen is None and doc["dispatch"] is None
    if revision < 3 or revision > 4:
        return False
    if state is P.COMMIT_UNKNOWN:
        return bool(revision == 3)  # it keeps its revision while it stays unknown
    proven = closure is not None and closure["proven"] is True
    pair = seen is not None and None not in (seen["target_uuid"], seen["generation_uuid"])
    if state is P.NOT_PUBLISHED:
        return proven and pair
    content = pair and None not in (seen["target_rows"], seen["target_content_digest"])
    return proven and content


OBSERVATIONS = [
    None,
    {
        "target_uuid": B,
        "generation_uuid": A,
        "target_rows": 10,
        "target_content_digest": "4" * 32,
        "exchange_finishes": 1,
    },
    {
        "target_uuid": A,
        "generation_uuid": B,
        "target_rows": None,
        "target_content_digest": None,
        "exchange_finishes": 0,
    },
    {
        "target_uuid": None,
        "generation_uuid": B,
        "target_rows": None,
        "target_content_digest": None,
        "exchange_finishes": None,
    },
]
CLOSURES = [
    None,
    {"strength": "custodial", "proven": True, "lease_id": "l"},
    {"strength": "revoked", "proven": False, "lease_id": "l"},
]
DISPATCHES = [
    None,
    {"query_id": "q", "session_id": "s", "outcome": "refused", "clickhouse_code": 60},
]


@settings(max_examples=1500, deadline=None)
@given(
    state=st.sampled_from(list(SnapshotState)),
    revision=st.integers(1, 7),
    claim=st.booleans(),
    closure=st.sampled_from(CLOSURES),
    observation=st.sampled_from(OBSERVATIONS),
    dispatch=st.sampled_from(DISPATCHES),
    reason=st.sampled_from([None, "cancelled", "closure_unproven"]),
    previous=st.booleans(),
)
def test_record_state_revision_and_shape(
    state: SnapshotState,
    revision: int,
    claim: bool,
    closure: dict[str, Any] | None,
    observation: dict[str, Any] | None,
    dispatch: dict[str, Any] | None,
    reason: str | None,
    previous: bool,
) -> None:
    doc = record_document(state, revision)
    doc.update(
        claim={"claim_id": "c", "claimed_at": AT} if claim else None,
        closure=copy.deepcopy(closure),
        observation=copy.deepcopy(observation),
        dispatch=copy.deepcopy(dispatch),
        reason=reason,
        previous_record_sha256="6" * 64 if previous else None,
    )
    data = dumps(doc)
    if _reachable(doc):
        record = SnapshotRecord.from_bytes(data)
        assert (record.raw, record.to_bytes()) == (data, data)
        assert record.sha256 == hashlib.sha256(data).hexdigest()
        assert (record.state, record.revision) == (state, revision)
    else:
        assert code_of(data, SnapshotRecord.from_bytes) == "unreachable_state"


@pytest.mark.parametrize(
    ("state", "revision"),
    [(s, r) for s in SnapshotState for r in range(1, 7)],
)
def test_every_state_revision_pair(state: SnapshotState, revision: int) -> None:
    data = dumps(record_document(state, revision))
    reachable = {
        P.PREPARED: revision == 1,
        P.EXCHANGE_INTENT: revision == 2,
        P.NOT_PUBLISHED: 2 <= revision <= 4,
        P.PUBLISHED: 3 <= revision <= 4,
        P.COMMIT_UNKNOWN: revision == 3,
    }[state]
    assert code_of(data, SnapshotRecord.from_bytes) == (None if reachable else "unreachable_state")


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        (("revision",), 0, "invalid_counter"),
        (("revision",), -3, "invalid_counter"),
        (("revision",), True, "invalid_counter"),
        (("observation", "target_rows"), -1, "invalid_counter"),
        (("observation", "exchange_finishes"), False, "invalid_counter"),
        (("state",), "half_published", "unknown_state"),
        (("intent_sha256",), "x", "invalid_digest"),
        (("previous_record_sha256",), "6" * 63, "invalid_digest"),
        (("observation", "target_uuid"), "nope", "invalid_uuid"),
        (("observation", "target_content_digest"), "4" * 31, "invalid_digest"),
        (("closure", "strength"), "strong", "invalid_document"),
        (("closure", "proven"), 1, "wrong_type"),
        (("claim", "claimed_at"), "yesterday", "invalid_timestamp"),
        (("at",), "", "invalid_timestamp"),
        (("record_version",), 0, "unsupported_version"),
        (("claim", "extra"), 1, "unknown_member"),
    ],
)
def test_record_refuses_malformed_values(path: tuple[str, ...], value: Any, code: str) -> None:
    doc = record_document(P.PUBLISHED, 3)
    _parent(doc, path)[path[-1]] = value
    assert code_of(dumps(doc), SnapshotRecord.from_bytes) == code


@pytest.mark.parametrize("member", list(record_document(P.PUBLISHED, 3)))
def test_record_refuses_each_missing_member(member: str) -> None:
    doc = record_document(P.PUBLISHED, 3)
    del doc[member]
    assert code_of(dumps(doc), SnapshotRecord.from_bytes) == "missing_member"


def test_record_refuses_a_dispatch_with_an_unknown_outcome() -> None:
    doc = record_document(P.COMMIT_UNKNOWN, 3)
    doc["dispatch"] = {
        "query_id": "q",
        "session_id": None,
        "outcome": "maybe",
        "clickhouse_code": None,
    }
    assert code_of(dumps(doc), SnapshotRecord.from_bytes) == "invalid_document"


def test_record_refuses_duplicate_members() -> None:
    text = dumps(record_document(P.PREPARED, 1)).decode()
    data = text.replace('"revision":1', '"revision":1,"revision":1').encode()
    assert code_of(data, SnapshotRecord.from_bytes) == "duplicate_member"


# ---------------------------------------------------------------------- limits


def test_limits_from_document() -> None:
    doc = intent_document()["limits"]
    assert SnapshotLimits.from_document(doc).to_document() == doc
    for name in doc:
        for bad, code in ((-1, "invalid_counter"), (True, "invalid_counter"), ("1", "wrong_type")):
            with pytest.raises(DponeError) as exc:
                SnapshotLimits.from_document({**doc, name: bad})
            assert exc.value.code == code, (name, bad)
    with pytest.raises(DponeError) as exc:
        SnapshotLimits.from_document({**doc, "extra": 1})
    assert exc.value.code == "unknown_member"
