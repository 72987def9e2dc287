"""The immutable attempt journal and the staging state machine (pure parts)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import pytest

from dpone.adapters.file_attempt_journal import ClickHouseFileAttemptJournal, read_events
from dpone.errors import JournalError, StateError
from dpone.runtime.staging_states import StageState, check_transition


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


def test_failed_write_does_not_advance_and_leaves_no_event(tmp_path: Path) -> None:
    journal = journal_with(tmp_path, 1)
    os.chmod(journal.events_dir, 0o500)
    try:
        if os.geteuid() == 0:
            (
                journal.events_dir / "000002"
            ).mkdir()  # root ignores modes: block the sequence instead
        with pytest.raises(JournalError) as caught:
            journal.record({"state": "checking"})
    finally:
        os.chmod(journal.events_dir, 0o700)
    assert caught.value.code == "journal_write_failed"
    assert (journal.sequence, len(read_events(journal.attempt_dir))) == (1, 1)


def test_resume_continues_the_chain(tmp_path: Path) -> None:
    journal_with(tmp_path, 2)
    again = ClickHouseFileAttemptJournal(tmp_path, "a-1")
    assert len(again.resume()) == 2
    again.record({"state": "cleanup"})
    assert [e.sequence for e in read_events(again.attempt_dir)] == [1, 2, 3]


def test_state_machine() -> None:
    s = StageState
    path = [
        s.CHECKING,
        s.PREPARING,
        s.PREPARED,
        s.CREATING_STAGING,
        s.LOADING,
        s.VERIFYING,
        s.STAGED,
    ]
    for a, b in itertools.pairwise(path):
        assert check_transition(a, b) is b
    for source in (s.CREATING_STAGING, s.LOADING, s.VERIFYING):
        assert check_transition(source, s.CLEANUP) is s.CLEANUP
    for end in (s.FAILED_CLEANED, s.RETAINED_UNKNOWN, s.CLEANUP_FAILED):
        assert check_transition(s.CLEANUP, end) is end
    for bad in [
        (s.CHECKING, s.LOADING),
        (s.STAGED, s.CLEANUP),
        (s.PREPARED, s.RETAINED_UNKNOWN),
        (s.LOADING, s.STAGED),
        (s.RETAINED_UNKNOWN, s.FAILED_CLEANED),
    ]:
        with pytest.raises(StateError):
            check_transition(*bad)
