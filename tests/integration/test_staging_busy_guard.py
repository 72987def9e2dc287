"""The busy guard holds per attempt (issue 37, item 15): on the real file system, and
two attempts staging on the real server at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError, StateError
from dpone.localserver import ServerInfo
from dpone.ports.clickhouse_request import ClickHouseRequest
from dpone.preparation.validated_file_artifact import ContractValidatedFileArtifact
from dpone.sinks import ClickHouseSink
from dpone.staging.composition import build_transport
from tests.plugins.staging import Interfering, config, export_hostile, runner, states, table_exists

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here


def test_an_attempt_is_active_once_whichever_object_it_enters_through(tmp_path: Path) -> None:
    """Reversal: with the guard per artifact object only, the same attempt entered
    through a second object of the same file while the first was active."""
    path, receipt, data = export_hostile(tmp_path)
    first = ContractValidatedFileArtifact(path, receipt)
    second = ContractValidatedFileArtifact(path, receipt)
    with first.file_validation_attempt("guard-1") as active:
        with pytest.raises(StateError) as caught, second.file_validation_attempt("guard-1"):
            pass
        assert caught.value.code == "attempt_busy"
        assert caught.value.details["active_on"] == str(path)
        # Another attempt on this object is refused too, and resets nothing.
        with pytest.raises(StateError) as again, first.file_validation_attempt("guard-2"):
            pass
        assert again.value.code == "artifact_busy"
        assert first.active is active
        # Another attempt through another object of the same file runs beside it.
        with second.file_validation_attempt("guard-2") as beside:
            assert beside.complete(len(data)).attempt_id == "guard-2"
        assert active.complete(len(data)).attempt_id == "guard-1"
    assert first.latest_summary is not None and first.latest_summary.attempt_id == "guard-1"
    assert second.latest_summary is not None and second.latest_summary.attempt_id == "guard-2"
    # Once it ended, the id may enter again (a fresh receipt binding).
    with second.file_validation_attempt("guard-1") as later:
        assert later.complete(len(data)).rows == len(data)


def test_two_attempts_stage_at_once_and_one_attempt_only_once(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """Reversal: with the guard per object, a second stage of attempt busy-1 (another
    sink, another work directory) passed the guard while the first waited before its
    CREATE, and created the first's staging table under it."""
    path, receipt, data = export_hostile(tmp_path)
    waiting, release = threading.Event(), threading.Event()

    def hold(request: ClickHouseRequest) -> None:
        if request.query_id == "dpone-b02-busy-1-create":
            waiting.set()
            assert release.wait(120)

    first_cfg = config(clickhouse, tmp_path / "work-a")
    first = ClickHouseSink(
        first_cfg, runner_factory=runner(Interfering(build_transport(first_cfg), hold))
    )
    outcome: dict[str, Any] = {}

    def stage_first() -> None:
        try:
            outcome["staged"] = first.stage_validated_file(path, receipt, attempt_id="busy-1")
        except BaseException as exc:  # reported by the assertions below
            outcome["error"] = exc

    thread = threading.Thread(target=stage_first)
    thread.start()
    try:
        assert waiting.wait(120), outcome
        other = ClickHouseSink(config(clickhouse, tmp_path / "work-b"))
        with pytest.raises(DponeError) as caught:
            other.stage_validated_file(path, receipt, attempt_id="busy-1")
        assert caught.value.code == "attempt_busy", caught.value
        assert not table_exists(clickhouse, "dpone_stage_busy_h1")  # nothing of it sent
        assert states(tmp_path / "work-b" / "busy-1")[-1] == "failed_cleaned"
        # A second attempt of the same file stages while the first is active.
        beside = other.stage_validated_file(path, receipt, attempt_id="busy-2")
        assert (beside.rows, beside.table) == (len(data), "dpone_stage_busy_h2")
    finally:
        release.set()
        thread.join(120)
    assert "error" not in outcome, outcome
    assert outcome["staged"].rows == len(data)
    assert states(tmp_path / "work-a" / "busy-1")[-1] == "staged"
    assert table_exists(clickhouse, "dpone_stage_busy_h1")
    assert table_exists(clickhouse, "dpone_stage_busy_h2")
