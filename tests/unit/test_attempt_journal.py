"""The immutable attempt journal and the staging state machine (pure parts)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import JournalError, StateError
from dpone.staging.journal import (
    ClickHouseFileAttemptJournal,
    pending_publication,
    read_events,
    verify_journal,
)
from dpone.staging.states import StageState, check_reentry, check_transition


def journal_with(tmp_path: Path, n: int = 3) -> ClickHouseFileAttemptJournal:
    journal = ClickHouseFileAttemptJournal(tmp_path, "a-1")
    journal.open()
    for i in range(n):
        journal.record(
            {"state": "checking", "outcome": f"step-{i}", "counts": {"observed_count": None}}
        )
    return journal


def test_events_chain_and_verify(tmp_path: Path) -> None:
    journal = journal_with(tmp_path)
    events = read_events(journal.attempt_dir)
    assert [e.sequence for e in events] == [1, 2, 3]
    assert events[0].document["previous_sha256"] is None
    assert events[1].document["previous_sha256"] == events[0].sha256
    assert events[2].path == tmp_path / "a-1" / "events" / "000003" / "attempt.json"
    assert oct(events[0].path.stat().st_mode & 0o777) == "0o600"


def test_attempt_directory_is_create_only(tmp_path: Path) -> None:
    journal_with(tmp_path)
    with pytest.raises(JournalError) as caught:
        ClickHouseFileAttemptJournal(tmp_path, "a-1").open()
    assert caught.value.code == "attempt_exists"


@pytest.mark.parametrize(
    ("damage", "code", "event"),
    [
        ("flip", "journal_noncanonical", "000002"),
        ("reformat", "journal_noncanonical", "000002"),
        ("delete_middle", "journal_sequence_gap", "000003"),
        ("rechain", "journal_chain_broken", "000003"),
        ("stray", "journal_sequence_gap", "x"),
    ],
)
def test_any_break_is_named(tmp_path: Path, damage: str, code: str, event: str) -> None:
    journal = journal_with(tmp_path)
    second = journal.events_dir / "000002" / "attempt.json"
    if damage == "flip":
        data = bytearray(second.read_bytes())
        data[-1] ^= 0x01  # the closing brace: no longer JSON
        second.write_bytes(bytes(data))
    elif damage == "reformat":
        second.write_text(json.dumps(json.loads(second.read_bytes()), indent=1))
    elif damage == "delete_middle":
        shutil.rmtree(journal.events_dir / "000002")
    elif damage == "rechain":
        doc = json.loads(second.read_bytes())
        doc["outcome"] = "rewritten"  # valid canonical bytes, but event 3's link breaks
        second.write_bytes(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    else:
        (journal.events_dir / "x").mkdir()
    with pytest.raises(JournalError) as caught:
        read_events(journal.attempt_dir)
    assert caught.value.code == code
    assert event in str(caught.value)


def test_unfinished_last_publication_is_not_an_event(tmp_path: Path) -> None:
    journal = journal_with(tmp_path, 2)
    (journal.events_dir / "000003").mkdir()
    (journal.events_dir / "000003" / ".attempt.json.partial").write_bytes(b"{")
    assert [e.sequence for e in read_events(journal.attempt_dir)] == [1, 2]


def failing_once(real: Callable[..., Any], fail_on: int = 1) -> Callable[..., Any]:
    """``real``, except that its ``fail_on``-th call raises (a disk that fails once)."""
    calls = 0

    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == fail_on:
            raise OSError(5, "Input/output error (simulated)")
        return real(*args, **kwargs)

    return call


def test_failing_fsync_does_not_advance_and_the_next_event_repairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = journal_with(tmp_path, 1)
    monkeypatch.setattr("dpone.staging.journal.os.fsync", failing_once(os.fsync))
    with pytest.raises(JournalError) as caught:
        journal.record({"state": "checking", "outcome": "lost"})
    monkeypatch.undo()
    assert caught.value.code == "journal_write_failed"
    assert "Input/output error" in str(caught.value)
    assert (journal.sequence, len(read_events(journal.attempt_dir))) == (1, 1)
    torn = journal.events_dir / "000002"
    assert sorted(p.name for p in torn.iterdir()) == [".attempt.json.partial"]
    # The torn publication does not block the journal: it is moved aside and named.
    event = journal.record({"state": "checking", "outcome": "next"})
    assert event.sequence == 2 and event.document["outcome"] == "next"
    partial_size = (tmp_path / "a-1" / "torn" / "000002" / ".attempt.json.partial").stat().st_size
    assert event.document["journal_repair"] == {
        "torn_publication": {
            "sequence": 2,
            "found": {".attempt.json.partial": partial_size},
            "moved_to": "torn/000002",
        }
    }
    assert [e.document["outcome"] for e in read_events(journal.attempt_dir)] == [
        "step-0",
        "next",
    ]


def test_failure_after_the_link_leaves_a_file_no_reader_adopts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = journal_with(tmp_path, 1)
    # fsync 1 is the partial file's; 2 is the sequence directory's, after the link.
    monkeypatch.setattr("dpone.staging.journal.os.fsync", failing_once(os.fsync, 2))
    with pytest.raises(JournalError) as caught:
        journal.record({"state": "checking", "outcome": "unconfirmed"})
    monkeypatch.undo()
    assert caught.value.code == "journal_write_failed"
    # The link made the file visible; its writer failed, so it carries no mark and no
    # reader takes it for an event.
    written = journal.events_dir / "000002" / "attempt.json"
    assert written.exists() and not (written.parent / "confirmed").exists()
    assert len(read_events(journal.attempt_dir)) == 1
    assert pending_publication(journal.attempt_dir, read_events(journal.attempt_dir)) == {
        "sequence": 2,
        "written": True,
        "path": str(written.parent),
    }
    size = written.stat().st_size
    event = journal.record({"state": "checking", "outcome": "next"})
    assert event.document["journal_repair"]["torn_publication"]["found"] == {"attempt.json": size}
    assert [e.document["outcome"] for e in read_events(journal.attempt_dir)] == ["step-0", "next"]


def test_a_mark_that_could_not_be_taken_back_stops_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = journal_with(tmp_path, 1)
    # fsync 4 is the sequence directory's again, after the mark was created.
    monkeypatch.setattr("dpone.staging.journal.os.fsync", failing_once(os.fsync, 4))
    real_unlink = os.unlink

    def unlink(path: Any, *, dir_fd: int | None = None) -> None:
        if path == "confirmed":
            raise OSError(30, "Read-only file system (simulated)")
        real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr("dpone.staging.journal.os.unlink", unlink)
    with pytest.raises(JournalError) as caught:
        journal.record({"state": "checking", "outcome": "unconfirmed"})
    monkeypatch.undo()
    assert caught.value.code == "journal_write_failed"
    assert "could not be removed" in "".join(getattr(caught.value.__cause__, "__notes__", []))
    assert journal.sequence == 1  # never advanced on an unconfirmed write
    # Its writer cannot vouch for it: the journal records nothing after it.
    with pytest.raises(JournalError) as refused:
        journal.record({"state": "cleanup", "outcome": "next"})
    assert refused.value.code == "journal_unconfirmed_event"
    assert refused.value.details["sequence"] == 2
    assert refused.value.details["event"].endswith("events/000002/attempt.json")
    assert sorted(p.name for p in journal.events_dir.iterdir()) == ["000001", "000002"]
    assert journal.sequence == 1


def test_a_mark_whose_sync_failed_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = journal_with(tmp_path, 1)
    monkeypatch.setattr("dpone.staging.journal.os.fsync", failing_once(os.fsync, 4))
    with pytest.raises(JournalError):
        journal.record({"state": "checking", "outcome": "unconfirmed"})
    monkeypatch.undo()
    assert not (journal.events_dir / "000002" / "confirmed").exists()
    assert len(read_events(journal.attempt_dir)) == 1
    assert journal.record({"state": "checking", "outcome": "next"}).sequence == 2


def test_events_go_to_the_directory_opened_not_the_path(tmp_path: Path) -> None:
    journal = journal_with(tmp_path, 1)
    moved = journal.attempt_dir.rename(tmp_path / "moved")
    (journal.attempt_dir / "events").mkdir(parents=True)  # someone else's, at the old path
    event = journal.record({"state": "checking", "outcome": "second"})
    assert event.sequence == 2
    assert [e.document["outcome"] for e in read_events(moved)] == ["step-0", "second"]
    assert list((journal.attempt_dir / "events").iterdir()) == []


def synced_inodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the inode of every descriptor the journal fsyncs."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr("dpone.staging.journal.os.fsync", fsync)
    return synced


def test_an_event_is_synced_file_and_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = journal_with(tmp_path, 1)
    synced = synced_inodes(monkeypatch)
    event = journal.record({"state": "checking", "outcome": "synced"})
    monkeypatch.undo()
    file, directory = event.path.stat().st_ino, event.path.parent.stat().st_ino
    # The event file, its directory, the events directory; then the mark's entry.
    assert synced == [file, directory, journal.events_dir.stat().st_ino, directory]
    assert (event.path.parent / "confirmed").stat().st_size == 0


def test_the_spool_entry_is_synced_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = journal_with(tmp_path, 1)
    journal.spool_dir.mkdir()
    (journal.spool_dir / "data.rowbinary").write_bytes(b"x")
    synced = synced_inodes(monkeypatch)
    journal.spool_prepared()
    assert synced == [journal.attempt_dir.stat().st_ino]  # the spool's entry in its parent
    journal.release_spool()
    assert not journal.spool_dir.exists()
    assert synced[1:] == [journal.attempt_dir.stat().st_ino]  # and its removal
    monkeypatch.undo()
    journal.release_spool()  # nothing left: nothing to do


def test_a_crash_left_directory_does_not_block_later_writes(tmp_path: Path) -> None:
    journal_with(tmp_path, 2)
    (tmp_path / "a-1" / "events" / "000003").mkdir()  # a crash right after mkdir
    again = ClickHouseFileAttemptJournal(tmp_path, "a-1")
    assert len(again.resume()) == 2
    event = again.record({"state": "cleanup"})
    assert event.sequence == 3
    assert event.document["journal_repair"]["torn_publication"]["moved_to"] == "torn/000003"
    assert len(read_events(again.attempt_dir)) == 3


def test_a_renamed_journal_verifies_and_a_head_pins_its_end(tmp_path: Path) -> None:
    journal = journal_with(tmp_path, 3)
    head = read_events(journal.attempt_dir)[-1].sha256
    archived = journal.attempt_dir.rename(tmp_path / "archive-of-a-1")
    assert len(verify_journal(archived, head=head)) == 3
    assert len(verify_journal(archived, head=head.upper())) == 3
    shutil.rmtree(archived / "events" / "000003")  # trailing events deleted
    assert len(read_events(archived)) == 2  # the chain alone cannot tell
    with pytest.raises(JournalError) as caught:
        verify_journal(archived, head=head)
    assert caught.value.code == "journal_head_mismatch"
    assert caught.value.details["events"] == 2


def test_an_empty_journal_does_not_verify(tmp_path: Path) -> None:
    journal = ClickHouseFileAttemptJournal(tmp_path, "a-1")
    journal.open()
    assert read_events(journal.attempt_dir) == []
    with pytest.raises(JournalError) as caught:
        verify_journal(journal.attempt_dir)
    assert caught.value.code == "journal_empty"


def test_resume_continues_the_chain(tmp_path: Path) -> None:
    journal_with(tmp_path, 2)
    again = ClickHouseFileAttemptJournal(tmp_path, "a-1")
    assert len(again.resume()) == 2
    again.record({"state": "cleanup"})
    assert [e.sequence for e in read_events(again.attempt_dir)] == [1, 2, 3]


PATH = ["checking", "preparing", "prepared", "creating_staging", "loading", "verifying", "staged"]
# Written out independently of the module: every edge the attempt itself may take.
EDGES = set(itertools.pairwise(PATH)) | {
    ("checking", "failed_cleaned"),
    ("preparing", "failed_cleaned"),
    ("prepared", "failed_cleaned"),
    ("creating_staging", "cleanup"),
    ("loading", "cleanup"),
    ("verifying", "cleanup"),
    ("cleanup", "failed_cleaned"),
    ("cleanup", "retained_unknown"),
    ("cleanup", "cleanup_failed"),
    ("discarding", "discarded"),
}


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product([s.value for s in StageState], repeat=2))
)
def test_state_machine(current: str, target: str) -> None:
    a, b = StageState(current), StageState(target)
    if (current, target) in EDGES:
        assert check_transition(a, b) is b
    else:
        with pytest.raises(StateError):
            check_transition(a, b)


@pytest.mark.parametrize("current", [s.value for s in StageState])
def test_reentry(current: str) -> None:
    """An operator may clean up what needs one; only a staged table may be discarded."""
    state = StageState(current)
    needs = current in ("retained_unknown", "cleanup_failed") or current not in (
        "staged",
        "failed_cleaned",
        "discarded",
    )
    if needs and current != "discarding":
        assert check_reentry(state, StageState.CLEANUP) is StageState.CLEANUP
    else:
        with pytest.raises(StateError):
            check_reentry(state, StageState.CLEANUP)
    if current in ("staged", "discarding"):
        assert check_reentry(state, StageState.DISCARDING) is StageState.DISCARDING
    else:
        with pytest.raises(StateError):
            check_reentry(state, StageState.DISCARDING)
