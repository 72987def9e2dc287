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
