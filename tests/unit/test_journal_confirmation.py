"""Readers adopt only the events their writer confirmed (issue 37, item 11), on the real
file system: a writer killed between making its event visible and confirming it leaves
a file that no reader (``read_events``, ``resume``, the attempts survey, ``attempts
list``) takes for an event, and the next record moves it aside.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from dpone.staging.journal import ClickHouseFileAttemptJournal, read_events
from dpone.staging.leftovers import finishing_command
from dpone.staging.recovery import survey_attempts
from tests.plugins.cli import as_json, dpone

VERIFYING = {
    "state": "verifying",
    "outcome": "counted",
    "planned_ownership": {"database": "stg", "table": "dpone_stage_a1"},
    "cleanup_inventory": {"table": {"database": "stg", "table": "dpone_stage_a1"}},
}


def killed_after_the_link(work: Path, attempt: str, fields: dict[str, Any]) -> None:
    """A child process resumes the journal and is SIGKILLed right after the link that
    makes its next event visible, before it can confirm it."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            child = ClickHouseFileAttemptJournal(work, attempt)
            child.resume()
            real_link = os.link

            def link(*args: Any, **kwargs: Any) -> None:
                real_link(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)

            os.link = link  # the child's own module: it dies
            child.record(fields)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_an_event_whose_writer_died_before_confirming_it_is_never_adopted(
    tmp_path: Path,
) -> None:
    """Reversal: with the mark check removed from ``read_events``, the survey took the
    visible ``staged`` file for the attempt's state: hidden from ``attempts list``, and
    ``staged`` (to be discarded) under ``--all``, although its writer never confirmed it
    and the table was never verified."""
    work = tmp_path / "work"
    journal = ClickHouseFileAttemptJournal(work, "a1")
    journal.open()
    journal.record(VERIFYING)
    journal.close()
    killed_after_the_link(work, "a1", {**VERIFYING, "state": "staged", "outcome": "staged"})
    visible = work / "a1" / "events" / "000002"
    assert (visible / "attempt.json").exists() and not (visible / "confirmed").exists()

    assert [e.document["state"] for e in read_events(work / "a1")] == ["verifying"]
    [summary], unreadable = survey_attempts(work)
    assert unreadable == []
    assert (summary.state, summary.last_sequence, summary.needs_operator) == ("verifying", 1, True)
    assert summary.unconfirmed == {"sequence": 2, "written": True, "path": str(visible)}
    command = finishing_command(summary.state, "a1", work, "stg")
    assert command is not None and command.startswith("dpone attempts cleanup a1")

    # The CLI lists it as what it provably is, with the command that finishes it.
    listed = dpone("attempts", "list", "--work-dir", str(work), "--json")
    [shown] = as_json(listed)["attempts"]
    assert (shown["state"], shown["needs_operator"]) == ("verifying", True)
    assert shown["unconfirmed_publication"]["sequence"] == 2
    assert shown["next_command"].startswith("dpone attempts cleanup a1 ")
    text = dpone("attempts", "list", "--work-dir", str(work)).stdout
    assert "event 2 was written but never confirmed by its writer: not adopted" in text

    # resume continues from the last confirmed event; the next record moves the
    # unconfirmed one aside and says so.
    later = ClickHouseFileAttemptJournal(work, "a1")
    assert [e.sequence for e in later.resume()] == [1]
    event = later.record({**VERIFYING, "state": "cleanup", "outcome": "started"})
    assert event.sequence == 2
    repair = event.document["journal_repair"]["torn_publication"]
    assert repair["moved_to"] == "torn/000002" and "attempt.json" in repair["found"]
    assert [e.document["state"] for e in read_events(work / "a1")] == ["verifying", "cleanup"]
    assert (work / "a1" / "torn" / "000002" / "attempt.json").exists()


def test_an_unconfirmed_event_followed_by_others_breaks_the_journal(tmp_path: Path) -> None:
    journal = ClickHouseFileAttemptJournal(tmp_path, "a1")
    journal.open()
    for n in range(3):
        journal.record({**VERIFYING, "outcome": f"step-{n}"})
    (journal.events_dir / "000002" / "confirmed").unlink()
    [], [broken] = survey_attempts(tmp_path)
    assert broken.error.code == "journal_unconfirmed_event"
    assert "000002" in broken.error.message


def test_a_mark_that_is_a_link_or_a_directory_confirms_nothing(tmp_path: Path) -> None:
    """Only a regular file confirms an event: a symbolic link to one (followed, it would
    say yes) or a directory of that name is not its writer's mark."""
    journal = ClickHouseFileAttemptJournal(tmp_path, "a1")
    journal.open()
    for n in range(2):
        journal.record({**VERIFYING, "outcome": f"step-{n}"})
    last = journal.events_dir / "000002" / "confirmed"
    elsewhere = tmp_path / "a-file"
    elsewhere.write_bytes(b"")
    last.unlink()
    last.symlink_to(elsewhere)
    assert [e.sequence for e in read_events(tmp_path / "a1")] == [1]
    last.unlink()
    last.mkdir()
    assert [e.sequence for e in read_events(tmp_path / "a1")] == [1]
