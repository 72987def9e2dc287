"""A first publication creates its target only after every check has passed (issue 22, 7)."""

from __future__ import annotations

import dataclasses

import pytest

from dpone.contracts.composition_snapshot import DEFAULT_LIMITS
from dpone.errors import DponeError
from dpone.ports.composition_snapshot import AttemptRef, TargetSlot
from dpone.publication.composition import PublicationConfig
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
