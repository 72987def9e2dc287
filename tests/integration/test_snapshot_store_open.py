"""Opening the snapshot store without creating it, and the lease holder records.

Reading and continuing commands open the store must-exist: a mistyped ``--store``
is ``store_missing`` naming the path, and no file (nor directory) appears. Leases
record the process that took them, so that a holder killed with SIGKILL can later be
proven gone; an operator's end is recorded beside it, and the row is kept.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dpone.errors import DponeError
from dpone.publication.store import (
    SnapshotStoreError,
    SqliteSnapshotStore,
    lease_step_key,
)
from dpone.publication.store.holder_process import Liveness, current_process, holder_liveness
from tests.plugins.cli import as_json, dpone

INTENT = "ab" * 32


def test_must_exist_open_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo" / "snapshots.sqlite"
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(path, create=False)
    assert caught.value.code == "store_missing"
    assert caught.value.details["path"] == str(path) and str(path) in caught.value.message
    assert not path.exists() and not path.parent.exists()


def test_must_exist_open_of_an_empty_file_leaves_it_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    path.write_bytes(b"")
    with pytest.raises(SnapshotStoreError) as caught:
        SqliteSnapshotStore(path, create=False)
    assert caught.value.code == "store_missing"
    assert path.read_bytes() == b""


def test_must_exist_open_reads_an_existing_store(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    lease = SqliteSnapshotStore(path).lease("ingest", ("u1",), "a-1")
    again = SqliteSnapshotStore(path, create=False)
    assert again.get_lease(lease.lease_id) == lease


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", "show", INTENT],
        ["snapshot", "publish", INTENT],
        ["snapshot", "reconcile", INTENT],
        ["snapshot", "cancel", INTENT],
        ["snapshot", "leases", "--work-dir", "w"],
        ["snapshot", "end-lease", "0" * 32, "--work-dir", "w"],
    ],
)
def test_reading_commands_refuse_a_mistyped_store_and_create_none(
    tmp_path: Path, argv: list[str]
) -> None:
    path = tmp_path / "mistyped" / "store.sqlite"
    done = dpone(*argv, "--store", str(path), "--json")
    answer = as_json(done)
    assert done.returncode == 1, done.stdout + done.stderr
    assert answer["error"]["code"] == "store_missing"
    assert answer["error"]["details"]["path"] == str(path)
    assert not path.exists() and not path.parent.exists()


def test_a_lease_records_its_holder_and_an_operator_end_is_noted(tmp_path: Path) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    lease = store.lease("ingest", ("u1", "u2"), "a-1")
    (record,) = store.lease_records()
    assert record.lease == lease and record.ended_at is None
    assert record.holder == current_process()
    assert holder_liveness(record.holder) == (
        Liveness.ALIVE,
        f"process {record.holder.pid} still runs",
    )
    ended, now = store.end_lease_of_gone_holder(lease.lease_id, {"reason": "attempt_terminal"})
    assert now is True and ended == dataclasses.replace(lease, active=False)
    assert store.lease_records() == []
    (kept,) = store.lease_records(active_only=False)
    assert kept.ended_at is not None and kept.holder == record.holder
    notes = [n.facts for n in store.step_notes(lease_step_key(lease.lease_id))]
    assert notes == [
        {"step": "issued", "holder": record.holder.to_dict()},
        {"step": "ended_by_operator", "reason": "attempt_terminal"},
    ]
    # Idempotent: a second end writes nothing and says it did not end it now.
    assert store.end_lease_of_gone_holder(lease.lease_id, {"reason": "again"}) == (ended, False)
    assert len(store.step_notes(lease_step_key(lease.lease_id))) == 2
    # Ended by the operator, but not proven quiescent: the user is not leased again
    # until its closure is proven (close-lease stores the proof).
    with pytest.raises(SnapshotStoreError) as held:
        store.lease("ingest", ("u1",), "a-2")
    assert held.value.code == "pool_exhausted"
    store.note_step(lease_step_key(lease.lease_id), {"step": "closure", "proven": True})
    assert store.lease("ingest", ("u1",), "a-2").user == "u1"


def test_holder_liveness_decides_only_from_kernel_facts() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        here = current_process()
        assert here.start_ticks is not None
        alive = dataclasses.replace(here, pid=child.pid, start_ticks=_start_ticks(child.pid))
        assert holder_liveness(alive)[0] is Liveness.ALIVE
        # The same pid with another start time is another process: the holder is gone.
        reused = dataclasses.replace(alive, start_ticks=alive.start_ticks + 1)  # type: ignore[operator]
        assert holder_liveness(reused) == (
            Liveness.GONE,
            f"pid {child.pid} now belongs to another process",
        )
    finally:
        child.kill()
        child.wait()
    assert holder_liveness(alive) == (Liveness.GONE, f"process {child.pid} no longer exists")
    assert holder_liveness(None)[0] is Liveness.UNKNOWN
    assert holder_liveness(dataclasses.replace(alive, host="elsewhere"))[0] is Liveness.UNKNOWN
    other_ns = dataclasses.replace(alive, pid_namespace=(here.pid_namespace or 0) + 1)
    assert holder_liveness(other_ns)[0] is Liveness.UNKNOWN
    rebooted = dataclasses.replace(here, boot_id="another-boot")
    expected = Liveness.GONE if here.machine_id else Liveness.UNKNOWN
    assert holder_liveness(rebooted)[0] is expected


def _start_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    return int(text.rpartition(")")[2].split()[19])


def test_last_leases_and_one_lease_are_read_without_the_rest_of_the_history(
    tmp_path: Path,
) -> None:
    store = SqliteSnapshotStore(tmp_path / "store.sqlite")
    issued = []
    for n, user in enumerate(["u1", "u2", "u1", "u1", "u2"]):
        lease = store.lease("ingest", (user,), f"a-{n}")
        issued.append(lease)
        if n < 4:  # the last one stays active
            store.end_lease(lease.lease_id)
            store.note_step(lease_step_key(lease.lease_id), {"step": "closure", "proven": True})
    # A note no reader can decode, first under a lease that is neither user's last:
    # only a read of the whole history meets it.
    with sqlite3.connect(tmp_path / "store.sqlite") as conn:
        conn.execute(
            "INSERT INTO steps (id, key, facts, at) VALUES (-1, ?, ?, ?)",
            (lease_step_key(issued[0].lease_id), b"{not json", "2026-01-01T00:00:00.000000Z"),
        )
    with pytest.raises(DponeError):
        store.lease_records(active_only=False)
    last = store.last_lease_records()
    assert [r.lease.lease_id for r in last] == [issued[3].lease_id, issued[4].lease_id]
    assert [r.lease.active for r in last] == [False, True]
    assert all(r.holder == current_process() for r in last)
    found = store.lease_record(issued[2].lease_id)
    assert found is not None and found[0].lease.lease_id == issued[2].lease_id
    assert found[1] is True  # u1 was leased again after it
    assert store.lease_record(issued[3].lease_id) == (last[0], False)
    assert store.lease_record("no-such-lease") is None
