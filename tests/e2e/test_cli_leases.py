"""Pool leases left by killed processes: when they stay, how status and end-lease end them.

Established here: ``dpone stage --principal pool`` and ``dpone refresh`` killed with
SIGKILL while staging leave their ingest lease active (nothing else ends it); four
such exhaust the ingest pool (``pool_exhausted``). A stage that completes keeps its
lease on purpose (``prepare`` or ``attempts discard`` ends it), and a lease of a
running process is never ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone.errors import StateError
from dpone.project.leases import end_gone_lease, end_lease_command, judge_leases
from dpone.publication.store import SqliteSnapshotStore, lease_step_key
from tests.plugins.cli import as_json, dpone
from tests.plugins.refresh import (
    DATABASE,
    SERVER_KINDS,
    converting,
    make_source,
    project,
    protected_server,
    rows_of,
    server_options,
    stage_argv,
)


@pytest.fixture(scope="module", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    yield from protected_server(tmp_path_factory, DATABASE, "lease-ch", request.param)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A file big enough that staging it is still running when it is killed."""
    root = tmp_path_factory.mktemp("lease-export")
    make_source(root / "shop.db", rows_of(150_000))
    out, receipt = root / "items.tsv", root / "items.receipt.json"
    done = dpone(
        "export",
        "--source",
        f"sqlite:{root / 'shop.db'}",
        "--table",
        "items",
        "--out",
        str(out),
        "--receipt-out",
        str(receipt),
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, receipt


def _run_until(argv: list[str], ready: Callable[[], bool]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DPONE_DATA_DIR"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 120
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the command ended before the point to kill it"
    return process


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def _journaled(attempt_dir: Path, events: int) -> Callable[[], bool]:
    # Confirmed events: a file its writer has not confirmed is not an event yet.
    return lambda: len(list(attempt_dir.glob("events/*/confirmed"))) >= events


def test_killed_stages_exhaust_the_pool_until_their_leases_are_ended(
    tmp_path: Path, server: dict[str, Any], export: tuple[Path, Path]
) -> None:
    work, store = tmp_path / "work", tmp_path / "store.sqlite"
    for n in range(4):
        attempt = f"kill-{n}"
        process = _run_until(
            stage_argv(export, server, work, store, attempt), _journaled(work / attempt, 3)
        )
        if n == 0:
            # While its process runs, the lease is live and is never ended.
            opened = SqliteSnapshotStore(store, create=False)
            (verdict,) = judge_leases(opened, [work])
            assert (verdict.holder, verdict.reason) == ("live", "process_alive")
            with pytest.raises(StateError) as refused:
                end_gone_lease(opened, verdict.lease_id, [work])
            assert refused.value.code == "lease_holder_live"
            assert opened.get_lease(verdict.lease_id).active
            assert process.poll() is None, "the stage ended before it was killed"
        _kill(process)
    fifth = dpone(*stage_argv(export, server, work, store, "kill-4"), "--json")
    assert fifth.returncode == 1 and as_json(fifth)["error"]["code"] == "pool_exhausted"

    listed = dpone("snapshot", "leases", "--store", str(store), "--work-dir", str(work), "--json")
    assert listed.returncode == 1, listed.stdout
    leases = as_json(listed)["leases"]
    assert sorted(e["attempt_id"] for e in leases) == [f"kill-{n}" for n in range(4)]
    assert sorted(e["user"] for e in leases) == [f"dpone_ingest_{n}" for n in range(1, 5)]
    for entry in leases:
        assert (entry["holder"], entry["reason"]) == ("gone", "process_gone"), entry
        assert entry["evidence"]["journal_state"] not in ("staged", "failed_cleaned")
        argv = entry["command"].split()
        assert argv[:4] == ["dpone", "snapshot", "end-lease", entry["lease_id"]]
        ended = dpone(*argv[1:], "--json")
        assert ended.returncode == 0, ended.stdout
        assert as_json(ended)["ended_now"] is True and as_json(ended)["active"] is False
    again = as_json(dpone(*leases[0]["command"].split()[1:], "--json"))
    assert (again["ok"], again["ended_now"]) == (True, False)
    # Ended, never deleted; each end is noted with what proved it.
    opened = SqliteSnapshotStore(store, create=False)
    kept = opened.lease_records(active_only=False)
    assert len(kept) == 4 and all(r.ended_at is not None for r in kept)
    note = opened.step_notes(lease_step_key(kept[0].lease.lease_id))[-1].facts
    assert note["step"] == "ended_by_operator" and note["reason"] == "process_gone"
    assert note["evidence"]["fact"].startswith(f"process {kept[0].holder.pid}")  # type: ignore[union-attr]

    # Ended, but not proven quiescent: the users are not leased again until their last
    # lease's closure is proven (a request of a killed stage may still arrive).
    held = dpone(*stage_argv(export, server, work, store, "held-1"), "--json")
    assert held.returncode == 1 and as_json(held)["error"]["code"] == "pool_exhausted"
    assert sorted(as_json(held)["error"]["details"]["unproven_leases"]) == sorted(
        e["lease_id"] for e in leases
    )
    for entry in leases:
        closed = dpone(
            "snapshot",
            "close-lease",
            entry["lease_id"],
            "--store",
            str(store),
            *server_options(server, tmp_path),
            "--json",
        )
        assert closed.returncode == 0, closed.stdout + closed.stderr
    # The pool has its users back. A stage that completes keeps its lease for
    # `prepare` (live even though its process has exited) until `attempts discard`.
    staged = dpone(*stage_argv(export, server, work, store, "done-1"), "--json")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    (verdict,) = judge_leases(opened, [work])
    assert (verdict.holder, verdict.reason) == ("live", "staged_unprepared")
    refused_cli = dpone(
        "snapshot",
        "end-lease",
        verdict.lease_id,
        "--store",
        str(store),
        "--work-dir",
        str(work),
        "--json",
    )
    assert refused_cli.returncode == 1
    assert as_json(refused_cli)["error"]["code"] == "lease_holder_live"
    discard = dpone(
        "attempts",
        "discard",
        "done-1",
        "--work-dir",
        str(work),
        "--database",
        DATABASE,
        *server_options(server, tmp_path),
        "--store",
        str(store),
        "--json",
    )
    assert discard.returncode == 0, discard.stdout
    assert judge_leases(opened, [work]) == []


def test_refresh_killed_in_stage_then_status_names_end_lease(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    make_source(tmp_path / "shop.db", rows_of(150_000))
    config = project(tmp_path, server, "t_lease_stage")
    attempts = tmp_path / "work" / "attempts"

    def staging() -> bool:
        return attempts.is_dir() and any(converting(a) for a in attempts.iterdir())

    process = _run_until(["refresh", "--config", str(config), "items"], staging)
    store = tmp_path / "store.sqlite"
    (live,) = judge_leases(SqliteSnapshotStore(store, create=False), [attempts])
    assert (live.holder, live.record.lease.role) == ("live", "ingest")
    _kill(process)
    status = as_json(dpone("status", "--config", str(config), "--json"))
    # One item: the attempt, whose cleanup ends its ingest lease too; the lease itself
    # is listed as gone, and end-lease would also take it.
    (attempt,) = status["needs_person"]
    assert attempt["command"].split()[1:3] == ["attempts", "cleanup"], attempt
    (active,) = status["active_leases"]
    assert (active["holder"], active["lease_id"], active["reason"]) == (
        "gone",
        live.lease_id,
        "process_gone",
    )
    ended = dpone(*end_lease_command(live.lease_id, store, [attempts]).split()[1:], "--json")
    assert ended.returncode == 0 and as_json(ended)["ended_now"] is True, ended.stdout
    after = as_json(dpone("status", "--config", str(config), "--json"))
    # Ended without a proven closure: a request of the lease may still arrive, so its
    # user would block prepare as a writer. The attempt's listed cleanup proves it, so
    # status lists it once; `snapshot leases` names the close-lease command.
    assert after["active_leases"] == [] and after["needs_person"] == [attempt]
    listed = dpone(
        "snapshot", "leases", "--store", str(store), "--work-dir", str(attempts), "--json"
    )
    assert listed.returncode == 1, listed.stdout
    (unproven,) = as_json(listed)["unproven"]
    assert unproven["lease_id"] == live.lease_id
    assert unproven["command"].split()[:4] == ["dpone", "snapshot", "close-lease", live.lease_id]
    # The attempt's own finishing command (cleanup or discard) still works afterwards.
    done = dpone(*attempt["command"].split()[1:], "--json")
    assert done.returncode == 0, done.stdout
    assert dpone("status", "--config", str(config)).returncode == 0
    opened = SqliteSnapshotStore(store, create=False)
    assert opened.closure_proven(opened.get_lease(live.lease_id))
    leases = dpone("snapshot", "leases", "--store", str(store), "--work-dir", str(attempts))
    assert leases.returncode == 0, leases.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_refresh_interrupted_in_stage_ends_its_lease_and_the_next_refresh_publishes(
    tmp_path: Path, server: dict[str, Any], signum: int
) -> None:
    make_source(tmp_path / "shop.db", rows_of(150_000))
    config = project(tmp_path, server, f"t_lease_sig{int(signum)}")
    attempts = tmp_path / "work" / "attempts"
    store = tmp_path / "store.sqlite"

    def staging() -> bool:
        return attempts.is_dir() and any(converting(a) for a in attempts.iterdir())

    process = _run_until(["refresh", "--config", str(config), "items"], staging)
    process.send_signal(signum)
    assert process.wait(timeout=120) == 128 + signum
    opened = SqliteSnapshotStore(store, create=False)
    # Before: the interrupted stage left its ingest lease active (7 of 7 in the issue).
    assert judge_leases(opened, [attempts]) == []
    (record,) = opened.lease_records(active_only=False)
    assert record.lease.role == "ingest" and not record.lease.active
    assert opened.closure_proven(record.lease)  # closed with a stored proof, not only ended
    for _ in range(2):
        again = dpone("refresh", "--config", str(config), "items", "--json")
        assert again.returncode == 0, again.stdout + again.stderr
    assert all(not r.lease.active for r in opened.lease_records(active_only=False))
