"""The verdict on each active ingest lease, from real journals and real (dead) processes.

Each lease is taken by a short-lived child process, so that its recorded holder is a
process that really existed and is really gone; the journals are written by the
journal writer itself. (Publisher leases bound to intents are exercised end to end
in tests/e2e/test_cli_leases.py and by the publication's own tests.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dpone.errors import StateError
from dpone.project.leases import end_gone_lease, judge_leases
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from dpone.staging.journal import ClickHouseFileAttemptJournal

USERS = ("u1", "u2", "u3", "u4", "u5", "u6", "u7")


def _lease_in_child(store: Path, attempt_id: str) -> str:
    """Lease from a child process that then exits: its holder is provably gone."""
    code = (
        "import sys\n"
        "from dpone.publication.store import SqliteSnapshotStore\n"
        f"print(SqliteSnapshotStore(sys.argv[1]).lease('ingest', {USERS!r}, sys.argv[2]).lease_id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(store), attempt_id],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _journal(work: Path, attempt_id: str, *states: str, **last: object) -> None:
    journal = ClickHouseFileAttemptJournal(work, attempt_id)
    journal.open()
    for n, state in enumerate(states):
        extra = last if n == len(states) - 1 else {}
        journal.record({"state": state, "outcome": state, **extra})


def test_ingest_verdicts_follow_the_journal_and_the_holder_process(tmp_path: Path) -> None:
    store_path, work, other = tmp_path / "store.sqlite", tmp_path / "attempts", tmp_path / "else"
    store = SqliteSnapshotStore(store_path)
    cases = {
        "terminal": ("checking", "failed_cleaned"),
        "unknown-end": ("checking", "retained_unknown"),
        "running": ("checking", "loading"),
        "staged": ("checking", "staged"),
        "no-journal": (),
    }
    ids = {}
    for attempt, states in cases.items():
        ids[attempt] = _lease_in_child(store_path, attempt)
        if states:
            _journal(work, attempt, *states)
    ids["rollback"] = _lease_in_child(store_path, "rollback")
    _journal(other, "rollback", "checking", "staged", rollback={"undone_intent": "x"})
    # A lease of this (live) process whose attempt is still running.
    ids["live"] = store.lease("ingest", USERS, "live").lease_id
    _journal(work, "live", "checking", "loading")

    verdicts = {v.record.lease.attempt_id: v for v in judge_leases(store, [work, other])}
    found = {a: (v.holder, v.reason) for a, v in verdicts.items()}
    assert found == {
        "terminal": ("gone", "attempt_terminal"),
        "unknown-end": ("gone", "attempt_terminal"),
        "running": ("gone", "process_gone"),
        "staged": ("live", "staged_unprepared"),
        "no-journal": ("unknown", "journal_not_found"),
        "rollback": ("gone", "rollback_abandoned"),
        "live": ("live", "process_alive"),
    }
    assert verdicts["running"].evidence["journal_state"] == "loading"
    assert verdicts["no-journal"].evidence["searched"] == [str(work), str(other)]

    for attempt, code in (
        ("staged", "lease_holder_live"),
        ("live", "lease_holder_live"),
        ("no-journal", "lease_holder_unknown"),
    ):
        with pytest.raises(StateError) as refused:
            end_gone_lease(store, ids[attempt], [work, other])
        assert refused.value.code == code
        assert store.get_lease(ids[attempt]).active
        assert [n.facts["step"] for n in store.step_notes(lease_step_key(ids[attempt]))] == [
            "issued"
        ]
    for attempt in ("terminal", "unknown-end", "running", "rollback"):
        verdict, ended = end_gone_lease(store, ids[attempt], [work, other])
        assert ended and verdict is not None and verdict.reason == found[attempt][1]
        assert not store.get_lease(ids[attempt]).active
    # Without the directory that holds its journal, a staged attempt is not judged gone.
    (still,) = [v for v in judge_leases(store, [other]) if v.record.lease.attempt_id == "staged"]
    assert (still.holder, still.reason) == ("unknown", "journal_not_found")
    remaining = {v.record.lease.attempt_id for v in judge_leases(store, [work, other])}
    assert remaining == {"staged", "no-journal", "live"}
