"""A first publication creates its target only after every check has passed (issue 22, 7)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import pytest

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS, create_target_query_id
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import (
    AttemptRef,
    DispatchResult,
    IssuedPrincipal,
    TargetSlot,
)
from dpone.publication.composition import PublicationConfig
from dpone.publication.executor import ClickHouseSnapshotExecutor
from dpone.staging.service import StagedTable
from tests.integration.test_publication_faults import DB, managed, rig  # noqa: F401 (fixtures)
from tests.publication_harness import Rig, Row, build

ROWS: list[Row] = [(1, "one", 1), (2, "two", 2), (3, None, 3)]


def test_a_first_prepare_over_a_limit_creates_no_target(rig: Rig) -> None:  # noqa: F811
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


def test_a_first_prepare_within_its_limits_still_creates_the_target(rig: Rig) -> None:  # noqa: F811
    staged = rig.stage(ROWS, "first-ok")
    prepared = rig.prepare(staged, "t_first_ok")
    assert prepared.state.value == "prepared"
    assert rig.uuid_of("t_first_ok") == prepared.target_uuid


def test_a_refused_prepare_fences_no_older_prepared_attempt(rig: Rig) -> None:  # noqa: F811
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


def _prepare_after_create(
    rig: Rig,  # noqa: F811
    attempt: str,
    target: str,
    *then: str,
) -> tuple[DponeError, StagedTable]:
    """A first prepare whose new target gets ``then`` run on it right after its CREATE."""
    staged = rig.stage(ROWS, attempt)

    def run(table: str) -> None:
        for statement in then:
            rig.admin(statement.format(db=DB, target=table))

    _AfterCreate.then = run
    publisher = rig.components(executor=_AfterCreate).publisher
    slot = TargetSlot(DB, target)
    with pytest.raises(DponeError) as caught:
        publisher.prepare(AttemptRef(staged.journal_path, slot), staged.journal_head)
    assert rig.uuid_of(staged.table) == staged.uuid  # B is untouched either way
    rig.admin(f"DROP TABLE {DB}.{target}_buf")
    return caught.value, staged


def test_a_prepare_refused_after_its_create_drops_the_empty_target(rig: Rig) -> None:  # noqa: F811
    # A Buffer over the new target appears between the CREATE and the re-observation:
    # a hidden writer, so the prepare is refused after the CREATE was acknowledged.
    refused, staged = _prepare_after_create(rig, "after-create", "t_after_create", _BUFFER)
    assert refused.code == "side_effect_present"
    assert refused.details["created_target"] == "dropped"
    assert rig.uuid_of("t_after_create") is None  # no empty target was left behind
    store = rig.components().store
    notes = store.step_notes(create_target_query_id(staged.journal_head))
    steps = [n.facts["step"] for n in notes]
    assert steps == [
        "create_target",
        "create_target_answer",
        "drop_created_target",
        "drop_created_target_answer",
    ]
    assert notes[2].facts["table_uuid"] == refused.details["created_target_uuid"]
    assert notes[2].facts["refusal"] == "side_effect_present"
    assert notes[3].facts["outcome"] == "acknowledged"


def test_a_created_target_that_got_a_row_is_left_and_said_so(rig: Rig) -> None:  # noqa: F811
    # A row lands in the new target (an admin's INSERT) and a Buffer appears: the
    # prepare is refused, and the table is no longer verifiably the empty one it
    # created, so it is left where it is, and the refusal says so.
    refused, _ = _prepare_after_create(
        rig,
        "after-create-row",
        "t_after_row",
        "INSERT INTO {db}.{target} VALUES (7, 'seven', 7)",
        _BUFFER,
    )
    assert refused.code == "side_effect_present"
    assert refused.details["created_target"] == "left"
    assert refused.details["created_target_drop"] == "target_not_empty"
    assert rig.uuid_of("t_after_row") == refused.details["created_target_uuid"]
    assert rig.rows_of("t_after_row") == [(7, "seven", 7)]  # nothing of it was lost
