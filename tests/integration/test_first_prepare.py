"""A first publication creates its target only after every check has passed (issue 22, 7)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from dpone.contracts.composition_snapshot import (
    DEFAULT_LIMITS,
    SnapshotIntent,
    create_target_query_id,
)
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    AttemptRef,
    DispatchResult,
    IssuedPrincipal,
    TargetSlot,
)
from dpone.project.retention import created_target
from dpone.publication.composition import PublicationConfig
from dpone.publication.dispatch.executor import ClickHouseSnapshotExecutor
from dpone.publication.publisher import PublicationReceipt
from dpone.publication.store import SqliteSnapshotStore
from dpone.publication.store.errors import SnapshotStoreError
from dpone.staging.service import StagedTable
from tests.plugins.publication_rig import DB
from tests.publication_harness import Rig, Row, build

ROWS: list[Row] = [(1, "one", 1), (2, "two", 2), (3, None, 3)]


def test_a_first_prepare_over_a_limit_creates_no_target(rig: Rig) -> None:
    staged = rig.stage(ROWS, "first-limit")
    tight = dataclasses.replace(DEFAULT_LIMITS, generation_storage_bytes=1)
    config = PublicationConfig(rig.data_dir, rig.store_path, tight)
    publisher = build(config, DB).publisher
    with pytest.raises(DponeError) as caught:
        publisher.prepare(
            AttemptRef(staged.journal_path, TargetSlot(DB, "t_first_limit")), staged.journal_head
        )
    assert caught.value.code == "limit_exceeded"
    assert caught.value.details["ceiling"] == "generation_storage_bytes"
    assert rig.uuid_of("t_first_limit") is None  # no empty target was left behind
    assert rig.uuid_of(staged.table) == staged.uuid  # B is untouched


def test_a_first_prepare_within_its_limits_still_creates_the_target(rig: Rig) -> None:
    staged = rig.stage(ROWS, "first-ok")
    prepared = rig.prepare(staged, "t_first_ok")
    assert prepared.state.value == "prepared"
    assert rig.uuid_of("t_first_ok") == prepared.target_uuid


def test_a_refused_prepare_fences_no_older_prepared_attempt(rig: Rig) -> None:
    older = rig.stage(ROWS, "fence-old")
    target = "t_fence"
    rig.existing_target(older, target, [(9, "nine", 9)])
    prepared = rig.prepare(older, target)
    assert prepared.state.value == "prepared"
    newer = rig.stage([*ROWS, (4, "four", 4)], "fence-new")
    # B of the newer attempt is changed behind staging's back: its prepare is refused.
    rig.admin(f"INSERT INTO {DB}.{newer.table} VALUES (5, 'five', 5)")
    with pytest.raises(DponeError) as caught:
        rig.prepare(newer, target)
    assert caught.value.code == "content_mismatch"
    # The older PREPARED attempt is still the slot's current one and publishes.
    published = rig.components().publisher.publish(prepared.intent_sha256)
    assert published.state.value == "published"
    assert rig.rows_of(target) == ROWS
    store = rig.components().store
    check = store.verify_chain(prepared.intent_sha256)
    assert check.verified and check.revisions == 3, check.to_dict()


class _AfterCreate(ClickHouseSnapshotExecutor):
    """The real executor; once its CREATE is acknowledged, the test's statement runs."""

    then: ClassVar[Callable[[str], None]]

    def create_target(
        self, slot: TargetSlot, generation_table: str, query_id: str, principal: IssuedPrincipal
    ) -> DispatchResult:
        result = super().create_target(slot, generation_table, query_id, principal)
        type(self).then(slot.table)
        return result


_BUFFER = (
    "CREATE TABLE {db}.{target}_buf AS {db}.{target} "
    "ENGINE = Buffer({db}, {target}, 1, 3600, 3600, 1000000, 1000000, 100000000, 100000000)"
)


class _RefusingStore(SqliteSnapshotStore):
    """The real store, refusing the intent before it writes anything (as it refuses a
    run that already has an intent)."""

    meanwhile: ClassVar[Callable[[], None] | None] = None

    def create(self, intent_bytes: bytes, record_bytes: bytes, authority: Any) -> None:
        meanwhile = type(self).meanwhile
        if meanwhile is not None:
            meanwhile()  # what happens on the server while the store is written
        raise SnapshotStoreError("intent was not stored: refused", code="attempt_used")


def _prepare_after_create(
    rig: Rig,
    staged: StagedTable,
    target: str,
    *then: str,
    refusing: bool = False,
) -> DponeError:
    """A first prepare whose new target gets ``then`` run on it right after its CREATE;
    with ``refusing``, the store refuses its intent."""

    def run(table: str) -> None:
        for statement in then:
            rig.admin(statement.format(db=DB, target=table))

    _AfterCreate.then = run
    swaps: dict[str, Any] = {"executor": _AfterCreate}
    if refusing:
        swaps["store"] = _RefusingStore
    publisher = rig.components(**swaps).publisher
    slot = TargetSlot(DB, target)
    with pytest.raises(DponeError) as caught:
        publisher.prepare(AttemptRef(staged.journal_path, slot), staged.journal_head)
    assert rig.uuid_of(staged.table) == staged.uuid  # B is untouched either way
    return caught.value


def _steps(rig: Rig, staged: StagedTable) -> list[dict[str, Any]]:
    notes = rig.components().store.step_notes(create_target_query_id(staged.journal_head))
    return [dict(n.facts) for n in notes]


def test_a_prepare_refused_after_its_create_drops_the_empty_target(rig: Rig) -> None:
    staged = rig.stage(ROWS, "after-create")
    refused = _prepare_after_create(rig, staged, "t_after_create", refusing=True)
    assert refused.code == "attempt_used"
    assert refused.details["created_target"] == "dropped"
    assert rig.uuid_of("t_after_create") is None  # no empty target was left behind
    notes = _steps(rig, staged)
    assert [n["step"] for n in notes] == [
        "create_target",
        "create_target_answer",
        "create_target_observed",
        "drop_created_target",
        "drop_created_target_answer",
    ]
    created = refused.details["created_target_uuid"]
    assert notes[2]["table_uuid"] == notes[3]["table_uuid"] == created
    assert (notes[3]["refusal"], notes[4]["outcome"]) == ("attempt_used", "acknowledged")

    # The user then makes a table of that name. A prepare of the same generation
    # publishes into it, and it is never counted as the empty table dpone created.
    users = rig.existing_target(staged, "t_after_create", [(9, "nine", 9)])
    prepared = rig.prepare(staged, "t_after_create")
    store = rig.components().store
    intent = SnapshotIntent.from_bytes(store.load(prepared.intent_sha256).intent_bytes)
    assert intent.target_uuid == users != created
    assert created_target(store, intent) is False


def test_a_prepare_refused_for_a_writer_keeps_the_table_and_its_pending_rows(
    rig: Rig,
) -> None:
    # A Buffer over the new target appears between the CREATE and the re-observation,
    # holding a row for it: a writer, so the prepare is refused after the CREATE. The
    # table is left (its row count cannot show what the Buffer holds), and so is the row.
    staged = rig.stage(ROWS, "after-create-buffer")
    refused = _prepare_after_create(
        rig,
        staged,
        "t_after_buffer",
        _BUFFER,
        "INSERT INTO {db}.{target}_buf VALUES (8, 'eight', 8)",
    )
    assert refused.code == "side_effect_present"
    assert refused.details["created_target"] == "left"
    assert refused.details["created_target_kept"] == "side_effect_present"
    assert rig.uuid_of("t_after_buffer") == refused.details["created_target_uuid"]
    assert [n["step"] for n in _steps(rig, staged)][-1] == "create_target_observed"
    rig.admin(f"DROP TABLE {DB}.t_after_buffer_buf")  # a Buffer flushes when dropped
    assert rig.rows_of("t_after_buffer") == [(8, "eight", 8)]  # nothing was lost


def test_a_created_target_that_got_a_row_is_left_and_said_so(rig: Rig) -> None:
    # A row lands in the new target (an admin's INSERT), then the store refuses the
    # intent: the table is no longer verifiably the empty one it created, so it is
    # left where it is, and the refusal says so.
    staged = rig.stage(ROWS, "after-create-row")
    refused = _prepare_after_create(
        rig,
        staged,
        "t_after_row",
        "INSERT INTO {db}.{target} VALUES (7, 'seven', 7)",
        refusing=True,
    )
    assert refused.code == "attempt_used"
    assert refused.details["created_target"] == "left"
    assert refused.details["created_target_drop"] == "target_not_empty"
    assert rig.uuid_of("t_after_row") == refused.details["created_target_uuid"]
    assert rig.rows_of("t_after_row") == [(7, "seven", 7)]  # nothing of it was lost


def test_a_writer_that_appears_after_the_checks_keeps_the_table(rig: Rig) -> None:
    # The Buffer (holding a row for the new target) appears only while the store takes
    # the intent, after the catalog was checked; the store then refuses. The catalog is
    # observed again before any DROP: the writer keeps the table, and its row.
    staged = rig.stage(ROWS, "after-checks")
    target = "t_after_checks"

    def meanwhile() -> None:
        rig.admin(_BUFFER.format(db=DB, target=target))
        rig.admin(f"INSERT INTO {DB}.{target}_buf VALUES (6, 'six', 6)")

    _RefusingStore.meanwhile = meanwhile
    try:
        refused = _prepare_after_create(rig, staged, target, refusing=True)
    finally:
        _RefusingStore.meanwhile = None
    assert refused.code == "attempt_used"
    assert refused.details["created_target"] == "left"
    assert refused.details["created_target_kept"] == "side_effect_present"
    assert [n["step"] for n in _steps(rig, staged)][-1] == "create_target_observed"
    rig.admin(f"DROP TABLE {DB}.{target}_buf")  # a Buffer flushes when dropped
    assert rig.rows_of(target) == [(6, "six", 6)]  # nothing was lost


def test_a_table_another_attempts_intent_names_is_left_for_it(rig: Rig) -> None:
    # While attempt A's first prepare has just created the target, attempt B of the
    # same slot prepares over it (its intent names the new table), which fences A. A
    # leaves the table to B, which publishes into it.
    first = rig.stage(ROWS, "named-a")
    second = rig.stage([*ROWS, (4, "four", 4)], "named-b")
    target = "t_named"
    prepared: list[PublicationReceipt] = []
    _AfterCreate.then = lambda table: prepared.append(rig.prepare(second, table))
    publisher = rig.components(executor=_AfterCreate).publisher
    with pytest.raises(DponeError) as caught:
        publisher.prepare(
            AttemptRef(first.journal_path, TargetSlot(DB, target)), first.journal_head
        )
    refused = caught.value
    assert refused.code == "attempt_fenced"
    assert refused.details["created_target"] == "left"
    assert refused.details["created_target_kept"] == "attempt_fenced"
    (other,) = prepared
    assert other.target_uuid == refused.details["created_target_uuid"] == rig.uuid_of(target)
    published = rig.components().publisher.publish(other.intent_sha256)
    assert published.state.value == "published"
    assert rig.rows_of(target) == [*ROWS, (4, "four", 4)]


def test_a_create_whose_lease_was_closed_meanwhile_is_not_sent(rig: Rig) -> None:
    """Before: with the publisher's credentials in hand, a prepare whose lease an
    operator closed meanwhile still sent the CREATE as the closed lease, and stored an
    intent naming it (issue 37, item 5). The lease is re-checked under the gate."""
    staged = rig.stage(ROWS, "first-closed")
    store = rig.components().store

    class ClosedMeanwhile(ClickHouseSnapshotExecutor):
        def create_target(
            self,
            slot: TargetSlot,
            generation_table: str,
            query_id: str,
            principal: IssuedPrincipal,
        ) -> DispatchResult:
            store.end_lease(principal.ref.lease_id)  # as `dpone snapshot close-lease` would
            return super().create_target(slot, generation_table, query_id, principal)

    with pytest.raises(DponeError) as caught:
        rig.components(executor=ClosedMeanwhile).publisher.prepare(
            AttemptRef(staged.journal_path, TargetSlot(DB, "t_first_closed")), staged.journal_head
        )
    assert caught.value.code == "create_target_failed"
    assert (caught.value.details["outcome"], caught.value.details["reason"]) == (
        "not_sent",
        "lease_ended",
    )
    assert rig.uuid_of("t_first_closed") is None  # no CREATE reached the server
    assert [s for s in store.list_snapshots() if s.target_table == "t_first_closed"] == []
