"""Staging on the real server when its journal cannot confirm an event, and the held
source's scans (issue 37, items 11 and 14)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import DponeError
from dpone.localserver import ServerInfo
from dpone.preparation.artifact import FileVerificationBudget, HeldArtifact
from dpone.sinks import ClickHouseSink
from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals, read_events
from dpone.staging.recovery import survey_attempts
from tests.plugins.staging import config, export_hostile, states, table_exists

pytestmark = pytest.mark.usefixtures("staging_database")  # the databases, for every test here


@contextlib.contextmanager
def failing_disk() -> Iterator[None]:
    """The sequence directory's sync after the link fails, and so does every removal
    of an event file: a writer that can neither confirm nor take back its event."""
    real_fsync, real_unlink, calls = os.fsync, os.unlink, [0]

    def fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 2:  # 1: the partial file; 2: its directory, after the link
            raise OSError(5, "Input/output error (simulated)")
        real_fsync(fd)

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        if path == "attempt.json":
            raise OSError(30, "Read-only file system (simulated)")
        real_unlink(path, dir_fd=dir_fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dpone.staging.journal.os.fsync", fsync)
        patch.setattr("dpone.staging.journal.os.unlink", unlink)
        yield


class UnconfirmedStaged(ClickHouseFileAttemptJournal):
    """The `staged` event is linked into place, and then its writer fails."""

    def _publish(self, events_fd: int, sequence: int, data: bytes) -> None:
        if b'"state":"staged"' not in data:
            super()._publish(events_fd, sequence, data)
            return
        with failing_disk():
            super()._publish(events_fd, sequence, data)


def test_a_staged_event_its_writer_failed_to_confirm_is_not_the_attempts_end(
    clickhouse: ServerInfo, tmp_path: Path
) -> None:
    """Before (issue 37, item 11): the visible `staged` file was adopted by every reader
    but its writer. Its writer could not take it back, so it refused the cleanup's
    records: the table stayed, the attempt was hidden from `attempts list` and showed as
    `staged` under `--all`, with the discard of a table never verified as staged."""
    path, receipt, _ = export_hostile(tmp_path)
    cfg = config(clickhouse, tmp_path / "work")
    sink = ClickHouseSink(cfg, journal_factory=file_journals(cfg.work_dir, UnconfirmedStaged))
    with pytest.raises(DponeError) as caught:
        sink.stage_validated_file(path, receipt, attempt_id="unconfirmed-1")
    assert caught.value.code == "journal_write_failed", caught.value
    attempt = tmp_path / "work" / "unconfirmed-1"
    events = states(attempt)
    assert "staged" not in events and events[-1] == "failed_cleaned", events
    assert not table_exists(clickhouse, "dpone_stage_unconfirmed_h1")
    # The unconfirmed file was moved aside by the cleanup's first record, which says so.
    repairs = [
        e.document["journal_repair"] for e in read_events(attempt) if "journal_repair" in e.document
    ]
    assert [r["torn_publication"]["moved_to"] for r in repairs] == ["torn/000006"]
    assert (attempt / "torn" / "000006" / "attempt.json").exists()
    [summary], unreadable = survey_attempts(tmp_path / "work")
    assert unreadable == [] and summary.unconfirmed is None
    assert (summary.state, summary.needs_operator) == ("failed_cleaned", False)


def test_the_held_source_is_never_scanned_without_a_budget(
    clickhouse: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reversal (issue 37, item 14): with preparation verifying the held descriptor
    again itself (``artifact.verify()`` without the caller's budget), a stage scanned
    the whole source a third time, outside every deadline and byte cap."""
    path, receipt, data = export_hostile(tmp_path)
    scans: list[FileVerificationBudget | None] = []
    real_verify = HeldArtifact.verify

    def verify(self: HeldArtifact, budget: FileVerificationBudget | None = None) -> Any:
        scans.append(budget)
        return real_verify(self, budget)

    monkeypatch.setattr(HeldArtifact, "verify", verify)
    cfg = config(clickhouse, tmp_path / "work")
    staged = ClickHouseSink(cfg).stage_validated_file(path, receipt, attempt_id="budgeted-1")
    assert staged.rows == len(data)
    assert states(staged.journal_path)[-1] == "staged"
    # Entry (the preparation deadline) and completion (the verification deadline).
    assert len(scans) == 2, scans
    assert all(isinstance(b, FileVerificationBudget) for b in scans), scans
    assert scans[0] is not scans[1]
