"""The journal's storage preflight on real file systems (issue 37, item 15): room and
writability are checked before a write, with a coded error, and nothing is written.

The full and the read-only file system are real tmpfs mounts, made in a private user
and mount namespace (``unshare -rm``), so no privilege is needed and nothing outside
the child process sees them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpone.errors import JournalError
from dpone.staging.contract import StagingPolicy
from dpone.staging.journal import ClickHouseFileAttemptJournal, file_journals, read_events
from dpone.staging.journal_storage import StoragePreflightService

EVENT = {"state": "checking", "outcome": "admitted", "cleanup_inventory": {}}


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def test_an_attempt_is_not_opened_without_its_reserve(tmp_path: Path) -> None:
    """Reversal: without the preflight the attempt directory was made on a disk that
    could not hold the spool's reserve; the policy's reserve is the one bound."""
    reserve = free_bytes(tmp_path) + 2**30
    factory = file_journals(tmp_path / "work")
    journal = factory(StagingPolicy(free_space_reserve_bytes=reserve), "a1")
    with pytest.raises(JournalError) as caught:
        journal.open()
    assert caught.value.code == "journal_storage_low"
    assert caught.value.details["reserve_bytes"] == reserve
    assert caught.value.details["need_bytes"] > caught.value.details["free_bytes"]
    assert caught.value.details["attempt_id"] == "a1"
    assert list((tmp_path / "work").iterdir()) == []  # nothing was written


def test_an_event_is_not_published_without_room_and_nothing_is_torn(tmp_path: Path) -> None:
    journal = ClickHouseFileAttemptJournal(tmp_path, "a1")
    journal.open()
    journal.record(EVENT)
    journal.storage = StoragePreflightService(record_reserve_bytes=free_bytes(tmp_path) + 2**30)
    with pytest.raises(JournalError) as caught:
        journal.record({**EVENT, "outcome": "refused"})
    assert caught.value.code == "journal_storage_low"
    assert sorted(p.name for p in journal.events_dir.iterdir()) == ["000001"]
    assert journal.sequence == 1
    journal.storage = StoragePreflightService()
    assert journal.record({**EVENT, "outcome": "next"}).sequence == 2
    assert "journal_repair" not in read_events(journal.attempt_dir)[-1].document


# Run in the namespace: a 256 KiB tmpfs holding a journal of one event; then the
# file system is filled (or remounted read-only) and a second event is recorded.
CHILD = """
import json, os, subprocess, sys
from dpone.errors import JournalError
from dpone.staging.journal import ClickHouseFileAttemptJournal
mount, case = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount], check=True)
journal = ClickHouseFileAttemptJournal(mount, "a1")
journal.open()
journal.record({"state": "checking", "outcome": "admitted"})
if case == "full":
    fd = os.open(os.path.join(mount, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 4096):
            pass
    except OSError:
        pass
    os.close(fd)
else:
    subprocess.run(["mount", "-o", "remount,ro", mount], check=True)
try:
    journal.record({"state": "checking", "outcome": "second"})
    print(json.dumps({"code": None}))
except JournalError as exc:
    events = sorted(os.listdir(os.path.join(mount, "a1", "events")))
    print(json.dumps({"code": exc.code, "events": events, "torn": os.path.exists(
        os.path.join(mount, "a1", "events", "000002"))}))
"""


@pytest.mark.parametrize(
    ("case", "code"), [("full", "journal_storage_low"), ("ro", "journal_storage_unwritable")]
)
def test_a_full_or_read_only_file_system_is_refused_before_the_write(
    tmp_path: Path, case: str, code: str
) -> None:
    """Reversal: without the preflight, the full disk failed inside the publication
    (journal_write_failed, ENOSPC) and left a torn events/000002 to repair; the
    read-only one failed there too (EROFS)."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux unshare is part of the test environment"
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(
        [unshare, "-rm", sys.executable, "-c", CHILD, str(mount), case],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": code, "events": ["000001"], "torn": False}
